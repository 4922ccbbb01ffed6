"""The rollout-selection rules (selection.py) on hand-made batches, and in real runs."""
import itertools
import json

import pytest
import torch

import draws
import train
from config import Config, check_against_ranks, parse_config
from rollout import Rollouts
from selection import (RULES, cosines, dynamic_sampling, every_episode, gradient_alignment, max_variance_down_sampling,
                       max_variance_subset, selective_rollouts)
from test_train import SMALL, comparable, metrics, run

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def hand_made_sampler(rounds: list[list[list[float]]], calls: list):
    """sample(k, n) for selection rules: round k's prompt j gets the rewards rounds[k][j] (n of
    them). Responses are 2 + k tokens wide and prompts 3 + k, so that joining rounds pads."""
    def sample(k, n, keep=None, validation=False):
        calls.append((k, n) if not validation else ("validation", n))
        groups = rounds[-1] if validation else rounds[k]
        assert all(len(g) == n for g in groups)
        N, P, T = len(groups) * n, 3 + k, 2 + k
        rollouts = Rollouts(prompt_ids=torch.full((N, P), 10 + k), prompt_mask=torch.ones(N, P, dtype=torch.long),
                            response_ids=torch.arange(N * T).view(N, T), response_mask=torch.ones(N, T),
                            sampler_logprobs=torch.full((N, T), -1.0), truncated=torch.zeros(N, dtype=torch.bool),
                            prompt_index=[j for j in range(len(groups)) for _ in range(n)],
                            responses=[f"round {k} prompt {j} answer {a}" for j in range(len(groups)) for a in range(n)])
        return train.Buffer([f"round {k} prompt {j}" for j in range(len(groups))], rollouts, [False] * N,
                            torch.tensor([r for g in groups for r in g]), generated_tokens=N * T)
    return sample


def test_the_template_takes_the_iterations_own_prompts_and_every_episode():
    calls = []
    buf = every_episode(Config(samples_per_prompt=2), hand_made_sampler([[[1, 0], [0, 0]]], calls), {})
    assert calls == [(0, 2)] and buf.examples == ["round 0 prompt 0", "round 0 prompt 1"] and len(buf.rollouts) == 4
    assert RULES["none"] is every_episode


def test_dapo_keeps_the_groups_whose_rewards_differ_and_refills_from_later_rounds():
    rounds = [[[1, 1], [1, 0], [0, 0]],            # round 0: only prompt 1 is informative
              [[0, 0], [0, 1], [1, 1]],            # round 1: prompt 1
              [[1, 0], [0, 1], [1, 0]],            # round 2: all three, one is needed
              [[1, 0], [1, 0], [1, 0]]]            # never sampled: the batch is full after round 2
    calls, state = [], {}
    buf = dynamic_sampling(Config(prompts_per_iter=3, samples_per_prompt=2, dapo_rounds=3), hand_made_sampler(rounds, calls), state)
    assert calls == [(0, 2), (1, 2), (2, 2)]
    assert state["log"] == {"selection_rounds": 3, "selection_groups_found": 3}      # the iteration's metrics
    assert buf.examples == ["round 0 prompt 1", "round 1 prompt 1", "round 2 prompt 0"]
    assert buf.rewards.tolist() == [1, 0, 0, 1, 1, 0]
    assert buf.rollouts.prompt_index == [0, 0, 1, 1, 2, 2]
    assert buf.rollouts.responses == ["round 0 prompt 1 answer 0", "round 0 prompt 1 answer 1",
                                      "round 1 prompt 1 answer 0", "round 1 prompt 1 answer 1",
                                      "round 2 prompt 0 answer 0", "round 2 prompt 0 answer 1"]
    assert buf.generated_tokens == 3 * 2 * 2 + 3 * 2 * 3 + 3 * 2 * 4     # every round's tokens, dropped ones too
    # joined rounds are padded to the widest: prompts on the left, responses on the right, masks 0 there
    assert buf.rollouts.prompt_ids.shape == (6, 5) and buf.rollouts.response_ids.shape == (6, 4)
    assert buf.rollouts.prompt_mask[0].tolist() == [0, 0, 1, 1, 1] and buf.rollouts.response_mask[0].tolist() == [1, 1, 0, 0]
    assert buf.rollouts.response_mask[4].tolist() == [1, 1, 1, 1]


def test_dapo_stops_after_its_rounds_with_what_it_found_and_falls_back_when_it_found_nothing():
    calls = []
    found = dynamic_sampling(Config(prompts_per_iter=3, samples_per_prompt=2, dapo_rounds=1),
                             hand_made_sampler([[[1, 1], [1, 0], [0, 0]], [[0, 0], [0, 0], [1, 1]]], calls), {})
    assert calls == [(0, 2), (1, 2)] and found.examples == ["round 0 prompt 1"]
    calls = []
    none = dynamic_sampling(Config(prompts_per_iter=2, samples_per_prompt=2, dapo_rounds=2),
                            hand_made_sampler([[[1, 1], [0, 0]], [[0, 0], [0, 0]], [[1, 1], [1, 1]]], calls), {})
    assert len(calls) == 3 and none.examples == ["round 0 prompt 0", "round 0 prompt 1"]   # the iteration's own batch
    assert none.generated_tokens == 4 * 2 + 4 * 3 + 4 * 4
    zero_rounds = dynamic_sampling(Config(prompts_per_iter=2, samples_per_prompt=2, dapo_rounds=0),
                                   hand_made_sampler([[[1, 0], [0, 0]]], calls := []), {})
    assert calls == [(0, 2)] and zero_rounds.examples == ["round 0 prompt 0"]


@pytest.mark.parametrize("seed", range(40))
def test_max_variance_subset_is_the_best_of_every_subset(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 8, (1,), generator=g))
    m = int(torch.randint(1, n, (1,), generator=g))
    rewards = (torch.randint(0, 3, (n,), generator=g).float() - (seed % 2) * torch.rand(n, generator=g)).round(decimals=1)
    chosen = max_variance_subset(rewards, m)
    assert len(chosen) == m == len(set(chosen.tolist())) and chosen.tolist() == sorted(chosen.tolist())
    best = max(rewards[list(c)].double().var(unbiased=False).item() for c in itertools.combinations(range(n), m))
    assert rewards[chosen].double().var(unbiased=False).item() == pytest.approx(best, abs=1e-12)


def test_max_variance_subset_breaks_ties_by_the_smallest_k_and_one_stable_sort():
    assert max_variance_subset(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]), 2).tolist() == [1, 4]   # first 0, last 1
    assert max_variance_subset(torch.tensor([0.0, 0.0, 0.0]), 2).tolist() == [0, 1]             # all equal: first sampled
    assert max_variance_subset(torch.tensor([0.0, 1.0, 1.0, 1.0]), 2).tolist() == [0, 1]


def test_pods_samples_n_and_keeps_the_m_of_largest_variance_per_prompt():
    calls = []
    rounds = [[[1, 1, 1, 0], [0, 0, 1, 0], [1, 1, 1, 1]]]
    buf = max_variance_down_sampling(Config(samples_per_prompt=2, pods_samples=4), hand_made_sampler(rounds, calls), {})
    assert calls == [(0, 4)]
    assert buf.rollouts.prompt_index == [0, 0, 1, 1, 2, 2] and buf.rewards.tolist() == [1, 0, 0, 1, 1, 1]
    assert buf.rollouts.responses[:4] == ["round 0 prompt 0 answer 0", "round 0 prompt 0 answer 3",
                                          "round 0 prompt 1 answer 0", "round 0 prompt 1 answer 2"]
    assert buf.generated_tokens == 12 * 2 and len(buf.flipped) == 6    # every sampled token counts


def test_refill_prompts_come_from_a_stream_of_their_own_even_from_a_pool_smaller_than_a_batch():
    cfg = Config(prompts_per_iter=4, dapo_rounds=2, seed=3)
    pool = ["a", "b", "c"]                                                  # fewer prompts than a batch
    own = draws.iteration_prompts(pool, 0, 0, cfg)
    assert len(own) == 4 and set(own) <= set(pool)
    assert own == draws.iteration_prompts(pool, 0, 0, cfg)                   # the same draw on resume
    big = [f"p{i}" for i in range(1000)]
    rounds = [draws.iteration_prompts(big, it, k, cfg) for it in range(3) for k in range(3)]
    assert all(len(r) == 4 for r in rounds)
    refills = [p for it in range(3) for k in (1, 2) for p in draws.iteration_prompts(big, it, k, cfg)]
    assert len(set(refills)) == len(refills)                                 # no refill batch repeats another
    assert draws.iteration_prompts(big, 1, 0, cfg) == [big[i] for i in draws.batch_indices(1000, 1, 4, 3)]   # PPO's


def test_whitening_sees_only_what_the_rule_kept(tiny_dir, tmp_path, monkeypatch):
    """The field's bug: advantage statistics computed over the sampled batch before the filter.
    Here the rule's Buffer holds only what it kept, so the advantages the update uses have mean
    0 over the kept episodes' tokens."""
    seen = []

    def spy(cfg, buf, dist=train.SINGLE):
        out = compute(cfg, buf, dist)
        mask = buf.rollouts.response_mask
        seen.append((len(buf.rollouts), ((out[0] * mask).sum() / mask.sum()).item()))
        return out
    compute = train.compute_advantages
    monkeypatch.setattr(train, "compute_advantages", spy)
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "2", "--eval-every", "0", "--influence", "off",
                  "--selection", "pods", "--pods-samples", "5", "--kl-beta", "0")
    rows = metrics(run_dir)
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert [r["episodes"] for r in rows] == [6, 6] and len(episodes) == 12          # 2 prompts x 3 kept of 5
    assert [n for n, _ in seen] == [6, 6] and all(abs(mean) < 1e-6 for _, mean in seen)
    assert rows[0]["generated_tokens"] > rows[0]["response_tokens"] * rows[0]["episodes"]   # the dropped ones count


@pytest.mark.parametrize("flags", [["--selection", "dapo", "--dapo-rounds", "2"],
                                   ["--selection", "pods", "--pods-samples", "5"],
                                   ["--selection", "gradalign", "--gradalign-val", "2"]])
def test_a_run_of_each_rule_resumes_exactly(tiny_dir, tmp_path, flags):
    flags = ["--influence", "off", "--eval-every", "0", "--reward-noise", "0.3", *flags]
    full = run(tiny_dir, tmp_path / "full", "--iterations", "2", *flags)
    part = run(tiny_dir, tmp_path / "part", "--iterations", "1", *flags)
    train.main(["--resume", str(part), "--iterations", "2", "--no-progress"])
    a, b = metrics(full), metrics(part)
    assert [comparable(r) for r in a] == [comparable(r) for r in b]
    assert (full / "episodes.jsonl").read_text() == (part / "episodes.jsonl").read_text()


@pytest.mark.parametrize("argv, named", [
    (["--selection", "dapo"], "--selection: dapo replaces the influence filter"),
    (["--influence", "off", "--selection", "pods", "--samples-per-prompt", "4", "--pods-samples", "4"], "--pods-samples"),
    (["--influence", "off", "--dapo-rounds", "2"], "--dapo-rounds: does nothing with --selection none"),
    (["--influence", "off", "--selection", "dapo", "--pods-samples", "9"], "--pods-samples: does nothing"),
    (["--influence", "off", "--selection", "dapo", "--dapo-rounds", "-1"], "--dapo-rounds"),
    (["--influence", "off", "--selection", "dapo", "--greso-target", "0.3"], "--greso-target: does nothing"),
    (["--influence", "off", "--selection", "greso", "--greso-target", "1.5"], "--greso-target"),
    (["--train-pool", "-1"], "--train-pool"),
    (["--influence", "off", "--selection", "gradalign", "--gradalign-rounds", "1"], "--gradalign-rounds"),
    (["--influence", "off", "--selection", "gradalign", "--gradalign-val", "0"], "--gradalign-val"),
    (["--influence", "off", "--selection", "dapo", "--gradalign-val", "8"], "--gradalign-val: does nothing"),
])
def test_a_rule_that_makes_no_sense_is_refused(argv, named):
    with pytest.raises(SystemExit, match=named):
        parse_config(argv)


def test_a_rule_is_refused_under_torchrun():
    with pytest.raises(SystemExit, match="--selection pods: not implemented under torchrun"):
        check_against_ranks(parse_config(["--influence", "off", "--selection", "pods"]), ranks=2)


def test_shuffled_weights_keep_ippos_set_and_permute_its_weights_among_it():
    from influence import filter_and_reweight, shuffled_weights
    scores = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, 3.0, -0.2])
    keep, weights = filter_and_reweight(scores)
    shuffled_keep, shuffled = shuffled_weights(scores, torch.Generator().manual_seed(0))
    assert torch.equal(shuffled_keep, keep) and (shuffled[~keep] == 0).all()
    assert sorted(shuffled[keep].tolist()) == sorted(weights[keep].tolist())           # the same weights
    draws_ = [shuffled_weights(scores, torch.Generator().manual_seed(s))[1] for s in range(20)]
    assert any(not torch.equal(w, weights) for w in draws_)                            # on other episodes
    assert torch.equal(draws_[3], shuffled_weights(scores, torch.Generator().manual_seed(3))[1])


def test_a_run_with_shuffled_weights_logs_ippos_kept_set(tiny_dir, tmp_path):
    a = metrics(run(tiny_dir, tmp_path / "a", "--iterations", "1", "--eval-every", "0"))[0]
    b = metrics(run(tiny_dir, tmp_path / "b", "--iterations", "1", "--eval-every", "0", "--shuffle-weights"))[0]
    assert a["kept"] == b["kept"] and a["score_mean"] == b["score_mean"]     # same scores, same kept set


@pytest.mark.parametrize("argv", [["--influence", "off", "--shuffle-weights"], ["--random-filter", "--shuffle-weights"],
                                  ["--no-reweight", "--shuffle-weights"],
                                  ["--score-against", "batch", "--shuffle-weights"]])
def test_shuffled_weights_without_ippos_weights_are_refused(argv):
    with pytest.raises(SystemExit, match="--shuffle-weights"):
        parse_config(argv)


class Prompt:
    def __init__(self, where):
        self.where = where


def greso_sampler(pool: list, outcome, calls: list):
    """sample(k, n, keep) for GRESO: every round offers the prompts `pool`; a prompt's n rewards
    are all 1, all 0 or mixed as outcome(where) says ("right", "wrong", "mixed")."""
    def sample(k, n, keep=None):
        examples = keep(list(pool)) if keep else list(pool)
        calls.append([e.where for e in examples])
        rewards = {"right": [1.0] * n, "wrong": [0.0] * n, "mixed": [1.0] + [0.0] * (n - 1)}
        rounds = [[rewards[outcome(e.where)] for e in examples]]
        buf = hand_made_sampler(rounds, [])(0, n)
        buf.examples = examples
        return buf
    return sample


def test_greso_never_skips_a_new_prompt_and_keeps_each_prompts_streaks():
    pool = [Prompt(w) for w in ("a", "b", "c")]
    outcome = {"a": "right", "b": "wrong", "c": "mixed"}.get
    state, calls = {}, []
    cfg = Config(prompts_per_iter=3, samples_per_prompt=2, dapo_rounds=0, greso_target=0.25)
    selective_rollouts(cfg, greso_sampler(pool, outcome, calls), state)
    assert calls == [["a", "b", "c"]]                                        # nothing seen: nothing skipped
    assert state["streaks"] == {"a": [1, 0], "b": [0, 1], "c": [0, 0]}
    assert (state["sampled"], state["skipped"], state["iterations"]) == (3, 0, 1)
    assert (state["p_easy"], state["p_hard"]) == (0.5, 0.5) and not state["adapting"]   # no prompt met twice yet


def test_greso_skips_with_probability_one_minus_p_to_the_streak():
    pool = [Prompt(f"p{i}") for i in range(4000)]
    state = {"streaks": {f"p{i}": [2, 0] if i % 2 else [0, 3] for i in range(4000)}, "p_easy": 0.5, "p_hard": 0.8}
    calls = []
    cfg = Config(prompts_per_iter=4000, samples_per_prompt=2, dapo_rounds=0)
    selective_rollouts(cfg, greso_sampler(pool, lambda w: "mixed", calls), state)
    sampled = set(calls[0])
    easy_kept = sum(f"p{i}" in sampled for i in range(1, 4000, 2)) / 2000          # 0.5^2 = 0.25 kept
    hard_kept = sum(f"p{i}" in sampled for i in range(0, 4000, 2)) / 2000          # 0.8^3 = 0.512 kept
    assert abs(easy_kept - 0.25) < 0.04 and abs(hard_kept - 0.512) < 0.04
    assert state["skipped"] == 4000 - len(sampled)
    assert all(state["streaks"][w] == [0, 0] for w in sampled)                     # mixed answers end a streak


def test_greso_moves_p_towards_its_targets_within_bounds_and_never_samples_nothing():
    pool = [Prompt(w) for w in ("a", "b")]
    state, calls = {"streaks": {"a": [1, 0]}, "p_easy": 0.5, "p_hard": 0.05}, []
    cfg = Config(prompts_per_iter=2, samples_per_prompt=2, dapo_rounds=0, greso_target=0.3)
    selective_rollouts(cfg, greso_sampler(pool, lambda w: "right", calls), state)
    # "a" was met before: p moves. All-right share 1 >= 0.1: p_easy down; all-wrong share 0 < 0.2: p_hard up
    assert state["adapting"] and (state["p_easy"], state["p_hard"]) == (0.49, 0.06)
    assert state.pop("log") == {"selection_rounds": 1, "selection_groups_found": 0, "selection_skipped": 0,
                                "selection_p_easy": 0.49, "selection_p_hard": 0.06}   # the iteration's metrics
    state = {"streaks": {"a": [50, 0], "b": [50, 0]}, "p_easy": 0.05, "p_hard": 0.95, "adapting": True}
    for _ in range(5):   # streaks of 50: skipped with probability 0.99, yet a round is never empty
        calls = []
        selective_rollouts(cfg, greso_sampler(pool, lambda w: "right", calls), state)
        assert len(calls[0]) >= 1
    assert state["p_easy"] == 0.05 and state["p_hard"] == 0.95                      # the bounds hold


def test_a_greso_run_on_a_small_pool_resumes_exactly_with_its_history(tiny_dir, tmp_path):
    flags = ["--influence", "off", "--eval-every", "0", "--selection", "greso", "--train-pool", "3", "--dapo-rounds", "1",
             "--reward-noise", "0.5"]
    full = run(tiny_dir, tmp_path / "full", "--iterations", "4", *flags)
    part = run(tiny_dir, tmp_path / "part", "--iterations", "2", *flags)
    train.main(["--resume", str(part), "--iterations", "4", "--no-progress"])
    assert [comparable(r) for r in metrics(full)] == [comparable(r) for r in metrics(part)]
    assert (full / "episodes.jsonl").read_text() == (part / "episodes.jsonl").read_text()
    state = lambda d: json.loads((d / "checkpoints" / "iter_000004" / "state.json").read_text())["selection"]  # noqa: E731
    assert state(full) == state(part) and state(full)["iterations"] == 4 and len(state(full)["streaks"]) == 3


# ----------------------------------------------------------------------------- GradAlign

def test_gradalign_keeps_the_candidates_whose_gradient_is_closest_in_cosine_to_the_validation_gradient():
    rounds = [[[1, 0], [0, 0], [1, 1]],            # round 0: candidates 0-2
              [[0, 1], [1, 0], [0, 0]],            # round 1: candidates 3-5
              [[1, 0], [1, 1]]]                    # the validation problems' answers
    # each candidate's gradient, and the validation prompts' (summed: (1, 1, 0), cosine ignores scale)
    candidate = torch.tensor([[1.0, 1.0, 0.0], [5.0, 0.0, 0.0], [-1.0, -1.0, 0.0],
                              [0.0, 0.0, 0.0], [2.0, 2.0, 1.0], [0.0, 0.0, 7.0]])
    seen = []

    def gradients(buffer):
        seen.append(len(buffer.examples))
        return candidate if len(buffer.examples) == 6 else torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])

    calls, state = [], {}
    buf = gradient_alignment(Config(prompts_per_iter=3, samples_per_prompt=2, gradalign_rounds=2),
                             hand_made_sampler(rounds, calls), state, gradients)
    assert calls == [(0, 2), (1, 2), ("validation", 2)] and seen == [6, 2]
    # cosines: 1, 0.707, -1, 0 (a zero gradient), 0.943, 0: the best three are 0, 4 and 1, kept in sampled order
    assert buf.examples == ["round 0 prompt 0", "round 0 prompt 1", "round 1 prompt 1"]
    assert buf.rewards.tolist() == [1, 0, 0, 0, 1, 0] and buf.rollouts.prompt_index == [0, 0, 1, 1, 2, 2]
    assert buf.rollouts.responses[4:] == ["round 1 prompt 1 answer 0", "round 1 prompt 1 answer 1"]
    assert buf.generated_tokens == 6 * 2 + 6 * 3 + 4 * 2        # both rounds and the validation answers (round 0)
    c = 2 ** -0.5, 4 / 18 ** 0.5
    assert state["log"]["selection_cosine_kept"] == pytest.approx((1 + c[0] + c[1]) / 3)
    assert state["log"]["selection_cosine_candidates"] == pytest.approx((1 + c[0] - 1 + c[1]) / 6)
    assert RULES["gradalign"] is gradient_alignment


def test_cosines_against_torch_and_zero_for_a_zero_gradient():
    g = torch.Generator().manual_seed(0)
    grads, v = torch.randn(5, 40, generator=g), torch.randn(40, generator=g)
    grads[2] = 0
    expected = torch.nn.functional.cosine_similarity(grads.double(), v.double()[None], dim=1)
    expected[2] = 0
    torch.testing.assert_close(cosines(grads, v), expected)
    assert cosines(grads, torch.zeros(40)).tolist() == [0.0] * 5
    # ties go to the earlier candidate: equal cosines keep the sampled order
    assert torch.argsort(cosines(torch.ones(3, 2), torch.ones(2)), descending=True, stable=True).tolist() == [0, 1, 2]


def test_each_prompts_gradient_is_the_mean_of_its_episodes_gradients(tiny_dir):
    from influence import episode_gradients, group_gradients
    from test_influence import TEMPERATURE, make_buffer
    policy, _, rollouts, advantages = make_buffer(tiny_dir)
    episodes = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE)
    groups = group_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE)
    index = torch.tensor(rollouts.prompt_index)
    assert groups.shape == (len(set(rollouts.prompt_index)), episodes.shape[1])
    for row, j in enumerate(dict.fromkeys(rollouts.prompt_index)):
        torch.testing.assert_close(groups[row], episodes[index == j].mean(0), rtol=1e-4, atol=1e-6)


def test_gradalign_candidates_come_from_a_stream_of_their_own():
    cfg = Config(prompts_per_iter=4, seed=3, influence="off", selection="gradalign", gradalign_rounds=3)
    big = [f"p{i}" for i in range(1000)]
    further = [p for it in range(4) for k in (1, 2) for p in draws.iteration_prompts(big, it, k, cfg)]
    assert len(set(further)) == len(further)                                # no further batch repeats another
    assert draws.iteration_prompts(big, 1, 0, cfg) == [big[i] for i in draws.batch_indices(1000, 1, 4, 3)]   # PPO's


def test_a_gradalign_run_samples_validation_answers_and_counts_their_tokens(tiny_dir, tmp_path):
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "1", "--eval-every", "0", "--influence", "off",
                  "--selection", "gradalign", "--gradalign-val", "2")
    row = metrics(run_dir)[0]
    assert row["episodes"] == 6                                           # 2 prompts kept of 4, 3 answers each
    assert -1 <= row["selection_cosine_candidates"] <= row["selection_cosine_kept"] <= 1
    # 4 candidates and 2 validation problems, 3 answers each: more than the kept episodes' tokens
    assert row["generated_tokens"] > row["response_tokens"] * row["episodes"]
