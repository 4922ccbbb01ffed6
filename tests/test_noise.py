"""Planted reward noise (--reward-noise) and how well the influence scores find it."""
import json
import random

import pytest
import torch

import logbook
import draws
import train
from config import Config
from logbook import detection_auc
from reward import is_correct, reward_fn
from test_train import metrics, run


def test_flip_turns_right_into_wrong_and_back():
    assert reward_fn("Answer: 5", "5", "arith") == 1.0
    assert reward_fn("Answer: 5", "5", "arith", flip=True) == 0.0
    assert reward_fn("Answer: 4", "5", "arith", flip=True) == 1.0
    # The truncation penalty is not flipped.
    assert reward_fn("Answer: 4", "5", "arith", truncated=True, truncation_penalty=0.5, flip=True) == 0.5


def test_flips_have_the_asked_share_and_are_a_function_of_seed_and_iteration():
    cfg = Config(reward_noise=0.2, seed=3)
    flips = draws.planted_flips(cfg, 7, 20_000)
    share = sum(flips) / len(flips)
    assert abs(share - 0.2) < 0.015            # binomial sd 0.0028: a 5-sigma band
    assert draws.planted_flips(cfg, 7, 20_000) == flips
    assert draws.planted_flips(cfg, 8, 20_000) != flips
    assert not any(draws.planted_flips(Config(reward_noise=0.0), 7, 1000))
    assert all(draws.planted_flips(Config(reward_noise=1.0), 7, 1000))


def brute_force_auc(scores, positive):
    """Count the (positive, negative) pairs the scores order right, ties one half."""
    wins, pairs = 0.0, 0
    for s_p, p in zip(scores, positive):
        for s_n, n in zip(scores, positive):
            if p and not n:
                pairs += 1
                wins += 1.0 if s_p > s_n else 0.5 if s_p == s_n else 0.0
    return wins / pairs


def test_auc_against_a_brute_force_pair_count():
    rng = random.Random(0)
    for trial in range(20):
        n = rng.randint(2, 40)
        scores = [rng.choice([-1.0, 0.0, 0.5, 1.0, rng.gauss(0, 1)]) for _ in range(n)]   # with ties
        positive = [rng.random() < 0.6 for _ in range(n)]
        if all(positive) or not any(positive):
            positive[0] = not positive[0]
        got = detection_auc(torch.tensor(scores), torch.tensor(positive))
        assert got == pytest.approx(brute_force_auc(scores, positive), abs=1e-12)
    assert detection_auc(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([True, True, False])) == 1.0
    assert detection_auc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, True, False])) == 0.0
    assert detection_auc(torch.tensor([1.0, 2.0]), torch.tensor([True, True])) is None


def test_noise_metrics_by_hand():
    flipped = torch.tensor([True, False, False, True, False])
    keep = torch.tensor([False, True, True, True, False])
    scores = torch.tensor([-2.0, 1.0, 3.0, 0.5, -1.0])
    m = logbook.noise_metrics(flipped, keep, scores)
    assert m["flipped_fraction"] == pytest.approx(0.4)
    assert m["flipped_share_dropped"] == pytest.approx(0.5) and m["flipped_share_kept"] == pytest.approx(1 / 3)
    # not-flipped scores 1, 3, -1 against flipped -2, 0.5: pairs won 2 + 2 + 1 = 5 of 6
    assert m["flip_auc"] == pytest.approx(5 / 6)
    assert logbook.noise_metrics(flipped, keep, None) == {"flipped_fraction": pytest.approx(0.4)}


def test_noisy_run_records_flips_and_resumes_with_the_same_flips(tiny_dir, tmp_path):
    # Correctness is what is flipped, so without a truncation penalty an episode's reward is
    # exactly its correctness, flipped or not.
    noisy = ["--reward-noise", "0.5", "--truncation-penalty", "0", "--eval-every", "0"]
    straight = run(tiny_dir, tmp_path / "straight", "--iterations", "2", *noisy)
    episodes = [json.loads(l) for l in (straight / "episodes.jsonl").read_text().splitlines()]
    correct = [is_correct(e["answer"], e["gold"], "gsm8k") for e in episodes]
    assert [e["reward"] for e in episodes] == [float(c != e["flipped"]) for c, e in zip(correct, episodes)]
    assert 0 < sum(e["flipped"] for e in episodes) < len(episodes)
    rows = metrics(straight)[1:]
    for it, row in enumerate(rows, start=1):
        flips = [e["flipped"] for e in episodes if e["iteration"] == it]
        right = [c for c, e in zip(correct, episodes) if e["iteration"] == it]
        assert row["flipped_fraction"] == pytest.approx(sum(flips) / len(flips))
        assert row["accuracy"] == pytest.approx(sum(right) / len(right))   # the truth, not the noisy reward
        assert 0.0 <= row["flip_auc"] <= 1.0 or row["flip_auc"] is None
    interrupted = run(tiny_dir, tmp_path / "resumed", "--iterations", "1", *noisy)
    train.main(["--resume", str(interrupted), "--iterations", "2"])
    again = [json.loads(l) for l in (interrupted / "episodes.jsonl").read_text().splitlines()]
    assert [e["flipped"] for e in again] == [e["flipped"] for e in episodes]


def test_reward_noise_must_be_a_probability(tiny_dir, tmp_path):
    with pytest.raises(SystemExit, match="--reward-noise"):
        run(tiny_dir, tmp_path / "r", "--reward-noise", "1.5")
