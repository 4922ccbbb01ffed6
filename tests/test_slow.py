"""One iteration of I-PPO on the real offline Gemma-3-270M (a few minutes on 2 CPU cores)."""
import json

import pytest

import train


@pytest.mark.slow
def test_one_iteration_on_the_offline_gemma_270m(tmp_path):
    run_dir = train.main(["--iterations", "1", "--prompts-per-iter", "2", "--samples-per-prompt", "2",
                          "--max-new-tokens", "32", "--val-size", "4", "--eval-every", "0", "--no-progress",
                          "--data-source", "local", "--run-dir", str(tmp_path / "run")])
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["iteration"] == 1 and row["episodes"] == 4
    assert row["g_val_norm"] > 0 and row["score_min"] <= row["score_max"]
    assert (run_dir / "checkpoints" / "iter_000001" / "adapter.safetensors").exists()
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert all(e["response"] for e in episodes)  # the real model writes text
