"""The experiments' records that outlive their run directories: experiments/val-size/val_size.py
keeps each finished test-split run in a JSON record, by method, seed and machine, and pairs
I-PPO with PPO by seed only within one machine."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "experiments" / "val-size"), str(ROOT / "experiments" / "fair-test")]
import val_size  # noqa: E402


def fake_run(out: Path, method: str, seed: int, curve: dict[int, float], unfaithful: float) -> None:
    run_dir = out / "test" / f"{method}-val256-seed{seed}"
    run_dir.mkdir(parents=True)
    rows = [{"iteration": i, "kept_fraction": 0.5, "seconds": {"rollout": 0.5, "update": 1.0, "eval": 9.0}}
            for i in range(val_size.ITERATIONS + 1)]
    for i, acc in curve.items():
        rows[i].update(eval_accuracy=acc, eval_unfaithful_of_correct=unfaithful)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_record_keeps_runs_by_machine_and_pairs_within_one(tmp_path):
    out, record = tmp_path / "out", tmp_path / "record.json"
    end = val_size.ITERATIONS
    fake_run(out, "ppo", 0, {0: 0.2, 10: 0.3, end: 0.4}, 0.5)
    fake_run(out, "ippo", 0, {0: 0.2, 10: 0.4, end: 0.5}, 0.1)
    fake_run(out, "ppo", 1, {0: 0.2, 10: 0.3, end: 0.45}, 0.6)
    (out / "test" / "ippo-val256-seed1").mkdir()           # started, not finished: not recorded
    runs = val_size.update_record(out, record, "machine A")
    assert [(r["method"], r["seed"]) for r in runs] == [("ippo", 0), ("ppo", 0), ("ppo", 1)]
    ippo = runs[0]
    assert (ippo["start"], ippo["final"], ippo["unfaithful"]) == (0.2, 0.5, 0.1)
    assert ippo["mean"] == pytest.approx(0.45) and ippo["curve"] == {"0": 0.2, "10": 0.4, str(end): 0.5}
    assert (ippo["best"], ippo["best_iteration"], ippo["kept_fraction"]) == (0.5, end, 0.5)
    assert ippo["train_minutes"] == pytest.approx((end + 1) * 1.5 / 60)     # evaluation time left out
    # The same runs seen again from another machine are kept beside the first, not over them.
    runs = val_size.update_record(out, record, "machine B")
    assert len(runs) == 6 and json.loads(record.read_text()) == runs
    assert len(val_size.update_record(out, record, "machine B")) == 6      # replaced, not added
    text = val_size.test_report(runs)
    assert text.count("on machine A:") == 1 and text.count("on machine B:") == 1
    # Seed 0 is the only pair; seed 1 has no I-PPO run, so it is not in the difference.
    assert "I-PPO - PPO, final, paired by seed (1 seeds): **+0.100** (+0.100)" in text
    assert "I-PPO - PPO, unfaithful, paired by seed (1 seeds): **-0.400** (-0.400)" in text
    # Each method's interval is over its own finished seeds (PPO: 2; I-PPO's single run gets none).
    assert "- ppo, 2 seeds: final em 0.425 ± 0.318; change +22.5 ± 31.8 pt (smallest +20.0)" in text
    assert "- ippo," not in text
    assert (ippo["kept_first10"], ippo["kept_last10"]) == (0.5, 0.5)


def test_pairs_across_machines_are_never_made(tmp_path):
    a = {"start": 0.2, "final": 0.4, "mean": 0.3, "unfaithful": 0.5}
    runs = [{"method": "ppo", "seed": 0, "machine": "A", **a}, {"method": "ippo", "seed": 0, "machine": "B", **a}]
    assert "paired" not in val_size.test_report(runs)


def test_the_fair_tests_table_of_every_run_has_one_row_per_run_in_order():
    import fair_test
    run = {"start": 0.244, "final": 0.4, "maj8": 0.3, "unfaithful": 0.25, "minutes": 6.0}
    results = [{**run, "method": "ippo", "noise": 0.0, "seed": 1, "kept_curve": [0.4, 0.6]},
               {**run, "method": "ppo", "noise": 0.2, "seed": 0, "kept_curve": [1.0]},
               {**run, "method": "ppo", "noise": 0.0, "seed": 0, "kept_curve": [1.0]}]
    rows = [line for line in fair_test.seed_table(results, {"em": 0.244, "maj8": 0.2}) if line.startswith("| ") and "---" not in line][1:]
    assert rows == ["| PPO | 0 | 0 | 0.400 | +15.6 | 0.300 | 0.25 | 1.00 | 6.0 |",
                    "| I-PPO | 0 | 1 | 0.400 | +15.6 | 0.300 | 0.25 | 0.50 | 6.0 |",
                    "| PPO | 0.2 | 0 | 0.400 | +15.6 | 0.300 | 0.25 | 1.00 | 6.0 |"]
