"""The tiny world in a run: reasoning labels in episodes.jsonl and their rates in metrics.jsonl,
and a seed that means the same run whether the model was just built or came from the cache."""
import json
from pathlib import Path

import pytest
import torch

import model
import offline_models
import tiny_world
import train

SMALL = ["--prompts-per-iter", "2", "--samples-per-prompt", "3", "--max-new-tokens", "12", "--val-size", "4",
         "--eval-limit", "3", "--eval-max-new-tokens", "12", "--minibatch-size", "6", "--micro-batch-size", "3",
         "--no-progress", "--dataset", "arith", "--arith-terms", "3", "--influence", "off", "--iterations", "1",
         "--eval-every", "1", "--no-plots"]


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def rows(run_dir, name):
    return [json.loads(line) for line in (Path(run_dir) / name).read_text().splitlines()]


def test_arith_runs_label_every_episode_and_log_the_rates(tmp_path):
    run_dir = train.main(["--model", "tiny-arith", "--run-dir", str(tmp_path / "r"), *SMALL])
    episodes = rows(run_dir, "episodes.jsonl")
    assert episodes and all(e["reasoning"] in ("faithful", "unfaithful", "wrong") for e in episodes)
    assert all((e["reasoning"] != "wrong") == (e["reward"] == 1.0) for e in episodes)
    m = rows(run_dir, "metrics.jsonl")
    it1 = m[1]
    shares = [it1[f"{k}_fraction"] for k in ("faithful", "unfaithful", "wrong")]
    assert sum(shares) == pytest.approx(1.0)
    counted = {k: sum(e["reasoning"] == k for e in episodes) / len(episodes) for k in ("faithful", "unfaithful", "wrong")}
    assert shares == pytest.approx([counted["faithful"], counted["unfaithful"], counted["wrong"]])
    assert "eval_unfaithful_of_correct" in m[0] and "eval_unfaithful_of_correct" in it1


def test_gsm8k_episodes_carry_no_label(tiny_dir, tmp_path):
    args = list(SMALL)
    args[args.index("--dataset") + 1] = "gsm8k"
    del args[args.index("--arith-terms"):args.index("--arith-terms") + 2]
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), "--data-source", "local", *args])
    assert all(e["reasoning"] is None for e in rows(run_dir, "episodes.jsonl"))
    assert "faithful_fraction" not in rows(run_dir, "metrics.jsonl")[1]


def test_the_same_seed_gives_the_same_run_with_an_empty_or_a_full_cache(monkeypatch, tmp_path):
    """The first use of tiny-arith-v1 builds it (a few steps here), which draws from torch's
    global RNG; the run's seed is set after that, so the LoRA initialisation, and with it the
    whole first iteration, is the same as on a later run that finds the model cached."""
    real_build = tiny_world.build_tiny_arith
    builds = []

    def build(path, **kwargs):
        builds.append(path)
        return real_build(path, world=kwargs["world"], max_steps=2, eval_every=2, progress=False)

    monkeypatch.setattr(tiny_world, "build_tiny_arith", build)
    monkeypatch.setattr(offline_models, "CACHE_DIR", tmp_path / "cache")
    args = ["--model", "tiny-arith-v1", *SMALL]
    args[args.index("--arith-terms") + 1] = "2"
    first = train.main([*args, "--run-dir", str(tmp_path / "empty")])
    second = train.main([*args, "--run-dir", str(tmp_path / "full")])
    assert len(builds) == 1                                   # built by the first run only
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    assert [drop(r) for r in rows(first, "metrics.jsonl")] == [drop(r) for r in rows(second, "metrics.jsonl")]
    assert rows(first, "episodes.jsonl") == rows(second, "episodes.jsonl")
    from safetensors.torch import load_file
    a = load_file(first / "checkpoints" / "iter_000001" / "adapter.safetensors")
    b = load_file(second / "checkpoints" / "iter_000001" / "adapter.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_evaluate_labels_greedy_answers_and_samples_on_arith():
    from tasks import generate_arith
    from accuracy import evaluate
    from reasoning import label
    policy, tok = model.load_policy(offline_models.model_source("tiny-arith"), quiet=True)
    examples = generate_arith("test", terms=3)[:6]
    out = evaluate(policy, tok, examples, "arith", metrics="em,pass@2", max_new_tokens=40, batch_size=12,
                   progress=False)
    greedy, samples = out["reasoning"]["greedy"], out["reasoning"]["samples"]
    assert greedy["faithful"] + greedy["unfaithful"] + greedy["wrong"] == 6
    assert samples["faithful"] + samples["unfaithful"] + samples["wrong"] == 12
    assert greedy["n_correct"] == out["n_correct"]
    for p, e in zip(out["predictions"], examples):
        assert p["reasoning"] == label(p["response"], e.solution, e.gold)
        assert all(s["reasoning"] == label(s["response"], e.solution, e.gold) for s in p["samples"])
