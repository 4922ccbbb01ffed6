"""The whole loop on a tiny random Gemma-3: every mode runs, resume is exact, flags documented."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rundir
import train
from config import Config

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread

ROOT = Path(__file__).resolve().parent.parent
# The tiny model almost never answers correctly; the truncation penalty gives rewards that
# vary between episodes, so advantages, scores and updates are non-trivial.
SMALL = ["--prompts-per-iter", "2", "--samples-per-prompt", "3", "--max-new-tokens", "8", "--val-size", "4",
         "--eval-limit", "3", "--eval-max-new-tokens", "6", "--truncation-penalty", "1", "--minibatch-size", "4",
         "--micro-batch-size", "2", "--no-progress", "--data-source", "local"]


def run(tiny_dir, run_dir, *extra):
    return train.main(["--model", tiny_dir, "--run-dir", str(run_dir), *SMALL, *extra])


def metrics(run_dir):
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def comparable(m):
    return {k: v for k, v in m.items() if k != "seconds"}


def test_two_iterations_of_i_ppo(tiny_dir, tmp_path):
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "2", "--eval-every", "2")
    rows = metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert "eval_accuracy" in rows[0] and "eval_accuracy" in rows[2]
    for r in rows[1:]:
        assert r["episodes"] == 6 and 0 <= r["kept"] <= 6 and "score_mean" in r
        assert set(r["seconds"]) >= {"rollout", "reward", "advantages", "influence", "update"}
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 12
    for e in episodes:
        assert set(e) >= {"prompt", "response", "reward", "score", "kept", "weight", "iteration"}
        assert e["kept"] == (e["score"] > 0) and (e["weight"] > 0) == e["kept"]
    for r in rows[1:]:   # the effective number of episodes behind the update, from the weights
        w = [e["weight"] for e in episodes if e["iteration"] == r["iteration"] and e["kept"]]
        assert r["weight_ess"] == (pytest.approx(sum(w) ** 2 / sum(x * x for x in w)) if w else 0.0)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["influence"] == "on" and config["iterations"] == 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    assert (run_dir / "checkpoints" / "iter_000002" / "adapter.safetensors").exists()


def test_resume_reproduces_the_uninterrupted_run(tiny_dir, tmp_path):
    full = run(tiny_dir, tmp_path / "full", "--iterations", "2", "--eval-every", "0")
    part = run(tiny_dir, tmp_path / "part", "--iterations", "1", "--eval-every", "0")
    train.main(["--resume", str(part), "--iterations", "2", "--no-progress"])
    a, b = metrics(full), metrics(part)
    assert len(a) == len(b) == 2
    assert comparable(a[1]) == comparable(b[1])
    assert a[1]["kept"] < a[1]["episodes"] or a[1]["policy_loss"] != 0  # the iteration did something


@pytest.mark.parametrize("flags", [["--influence", "off"], ["--no-reweight"], ["--random-filter"]])
def test_ablations_run(tiny_dir, tmp_path, flags):
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "1", "--eval-every", "0", *flags)
    row = metrics(run_dir)[0]
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    if flags == ["--influence", "off"]:
        assert row["kept"] == 6 and "score_mean" not in row and all(e["weight"] == 1 for e in episodes)
    else:
        assert {e["weight"] for e in episodes} <= {0.0, 1.0}
        assert row["kept"] == sum(e["score"] > 0 for e in episodes)
        assert row["weight_ess"] == pytest.approx(row["kept"])          # weights all 1: |D'|


def test_i_grpo_filters_on_group_advantages(tiny_dir, tmp_path):
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "1", "--eval-every", "0", "--advantage", "grpo")
    row = metrics(run_dir)[0]
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert "score_mean" in row and row["explained_variance"] is None          # influence on, no critic
    assert row["kept"] == sum(e["kept"] for e in episodes) and all(e["kept"] == (e["score"] > 0) for e in episodes)


def test_sft_then_ppo_from_its_adapter(tiny_dir, tmp_path):
    sft_dir = run(tiny_dir, tmp_path / "sft", "--algo", "sft", "--iterations", "3", "--eval-every", "0",
                  "--sft-batch-size", "2", "--lr", "1e-2")
    losses = [m["sft_loss"] for m in metrics(sft_dir)]
    assert len(losses) == 3 and losses[-1] < losses[0]
    ppo_dir = run(tiny_dir, tmp_path / "ppo", "--iterations", "1", "--eval-every", "0", "--init-adapter", str(sft_dir))
    assert metrics(ppo_dir)[0]["episodes"] == 6
    # the KL reference is the SFT policy the run starts from: before the first update they agree
    assert abs(metrics(ppo_dir)[0]["kl"]) < 1e-5


def test_bad_flags_are_refused_naming_the_flag(tiny_dir, tmp_path):
    for flags, message in [(["--prompts-per-iter", "-1"], "--prompts-per-iter"), (["--clip-eps", "0"], "--clip-eps"),
                           (["--lora-rank", "0"], "--lora-rank"), (["--influence", "off", "--random-filter"], "--random-filter")]:
        with pytest.raises(SystemExit, match=message):
            train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "x"), *flags])
    with pytest.raises(SystemExit, match="--max-new-tokens 5000"):
        train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "y"), "--max-new-tokens", "5000"])


def test_help_documents_every_flag_with_its_default():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    flat = " ".join(out.split())
    import dataclasses
    flags = [f for f in dataclasses.fields(Config) if f.metadata.get("cli", True)]   # overrides: recorded, not a flag
    for f in flags:
        name = "--" + f.name.replace("_", "-")
        assert name in flat, name
    assert flat.count("(default:") >= len(flags)


def test_iteration_with_every_episode_dropped_skips_the_update(tiny_dir, tmp_path, capsys):
    # Without the truncation penalty the tiny model's rewards are all 0: the advantages, and so
    # every score, are 0; nothing is kept and the update is skipped, not crashed.
    run_dir = run(tiny_dir, tmp_path / "r", "--iterations", "1", "--eval-every", "0", "--truncation-penalty", "0",
                  "--seed", "3")
    row = metrics(run_dir)[0]
    assert row["accuracy"] == 0 and row["reward"] == 0
    assert row["kept"] == 0 and row["skipped"] is True and "policy_loss" not in row
    assert row["warnings"] == ["rewards_equal", "nothing_kept"]
    assert "[it 1] warning: every episode scored <= 0: update skipped" in capsys.readouterr().err
    assert rundir.latest_checkpoint(run_dir).name == "iter_000001"   # the iteration is still committed


def test_onepass_and_loop_runs_give_the_same_scores(tiny_dir, tmp_path):
    scores = {}
    for method, speedups in (("loop", "off"), ("onepass", "on")):
        run_dir = run(tiny_dir, tmp_path / method, "--iterations", "1", "--eval-every", "0",
                      "--speedups", speedups)
        scores[method] = [json.loads(l)["score"] for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert scores["loop"] == pytest.approx(scores["onepass"], rel=1e-4, abs=1e-7)
