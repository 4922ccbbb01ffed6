"""Each experiment's tables, regenerated from its records alone, are the ones committed beside
them (the figures are drawn by the same code from the same records; matplotlib's bytes vary
with its version, so the text is what is compared)."""
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"


def load(folder: str, module: str):
    sys.path.insert(0, str(EXPERIMENTS / folder))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.pop(0)


def test_tiny_learns_summary_comes_from_its_records(tmp_path):
    subprocess.run([sys.executable, str(EXPERIMENTS / "tiny-learns" / "tiny_learns.py"), "--summary-only", "--records",
                    str(EXPERIMENTS / "tiny-learns" / "records.json"), "--out", str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    assert (tmp_path / "summary.md").read_text() == (EXPERIMENTS / "tiny-learns" / "summary.md").read_text()
    assert (tmp_path / "learning.png").stat().st_size > 10_000


def test_filter_controls_report_comes_from_its_records():
    controls = load("filter-controls", "controls")
    assert controls.report(controls.read_records()) == (EXPERIMENTS / "filter-controls" / "report.md").read_text()


def test_val_size_report_comes_from_its_records():
    val_size = load("val-size", "val_size")
    record = val_size.read_record(val_size.RECORD)
    assert val_size.test_report(record) == val_size.REPORT.read_text()


def fake_record(arm, seed, ems, tokens_per_iteration, noise=0.0):
    """A test run's record: em (and faithful accuracy em - 0.1) at iterations 0, 10, ..., 150."""
    curve = {str(i): [em, em - 0.1, 0.2, i * tokens_per_iteration] for i, em in zip(range(0, 151, 10), ems)}
    last = curve["150"]
    return {"name": f"test-{arm}-seed{seed}", "arm": arm, "seed": seed, "phase": "test", "setting": "", "noise": noise,
            "machine": "m", "code": "c", "run_dir": "/nonexistent", "generated_tokens": 150 * tokens_per_iteration,
            "steps": {"iteration": 150, "em": last[0], "faithful": last[1], "unfaithful": 0.2, "maj8": None},
            "tokens": None, "scored_mean": 0.0, "curve": curve}


def test_rollout_selection_judges_each_rule_at_both_budgets(monkeypatch):
    rules = load("rollout-selection", "compare_rules")
    monkeypatch.setattr(rules, "TEST_SEEDS", [0, 1, 2])       # a design of 3 seeds: judged once all 3 are in
    ramp = [0.2 + 0.02 * k for k in range(16)]                 # 0.20 .. 0.50
    records = [fake_record("ppo", s, ramp, 100) for s in range(3)]
    records += [fake_record("pods", s, [e + 0.01 * (s + 1) for e in ramp], 200) for s in range(3)]   # 2x the tokens
    records = rules.token_budget_results(records)
    pods = [r for r in records if r["arm"] == "pods"]
    assert all(r["tokens"]["iteration"] == 70 and r["tokens"]["budget"] == 15000 for r in pods)   # 80 would be 16000
    assert pods[0]["tokens"]["em"] == ramp[7] + 0.01
    assert all(r["tokens"]["iteration"] == 150 for r in records if r["arm"] == "ppo")
    text = rules.report(records, {"ppo": 1.0, "pods": 1.5})
    # at matched steps PODS is 2 +- 2.5 points ahead of PPO (seed differences 1, 2, 3); at matched tokens far behind
    steps = text[text.index("matched optimizer steps"):text.index("matched generated tokens")]
    assert "| PODS max-variance down-sampling | 0, 1, 2 | 2.000 ± 2.484 (no difference shown)" in steps
    tokens = text[text.index("matched generated tokens"):]
    assert "| PODS max-variance down-sampling | 0, 1, 2 | -14.000 ± 2.484 (behind)" in tokens     # iteration 70
    # time to PPO's final mean em (0.5): PPO at iteration 150 x 1.0 s; PODS's mean curve at 140 x 1.5 s
    assert "| 1.00 | 1.00 |" in steps and "| 1.50 | 1.40 |" in steps


def test_rollout_selection_reports_the_small_pool_in_a_table_of_its_own(monkeypatch):
    rules = load("rollout-selection", "compare_rules")
    monkeypatch.setattr(rules, "TEST_SEEDS", [0, 1])
    ramp = [0.2 + 0.02 * k for k in range(16)]
    records = [fake_record("ppo", s, ramp, 100) for s in range(2)]
    for s in range(2):
        records += [dict(fake_record("ppo", s, [e - 0.05 for e in ramp], 100), phase="pool", name=f"pool-ppo-{s}"),
                    dict(fake_record("greso", s, [e - 0.05 + 0.01 * s for e in ramp], 80), phase="pool",
                         name=f"pool-greso-{s}", saved=0.2 + 0.1 * s)]
    text = rules.report(rules.token_budget_results(records), {})
    pool = text[text.index("the first 480 training prompts"):]
    assert "the recipe's prompts" in text[:text.index("the first 480 training prompts")]
    assert "| GRESO selective rollouts | 0, 1 |" in pool and "0.250 ± 0.635 |" in pool     # rollouts saved
    assert "| GRESO selective rollouts | 0, 1 | 0.500 ± 6.353 (no difference shown)" in pool     # minus PPO on the pool


def test_lab_sheet_ranges_come_from_its_records():
    lab = load("lab-sheet", "lab_runs")
    assert lab.report(lab.json.loads(lab.RECORDS.read_text())) == (EXPERIMENTS / "lab-sheet" / "ranges.md").read_text()


def test_lab_sheet_ranges_are_the_seeds_min_and_max_widened():
    lab = load("lab-sheet", "lab_runs")

    def record(arm, seed, em50, kept):
        return {"name": f"{arm}-seed{seed}", "arm": arm, "seed": seed, "kept_first10": kept, "kept_last10": kept,
                "evals": {"0": {"em": 0.244, "faithful": 0.17, "unfaithful": 0.3},
                          "50": {"em": em50, "faithful": em50 / 2, "unfaithful": 0.4}},
                "minutes": 3.0 + seed, "machine": "m", "code": "c"}
    records = [record("ppo", s, em, None) for s, em in zip(lab.SEEDS, (0.30, 0.36, 0.33))]
    records += [record("exercises", s, em, 0.5) for s, em in zip(lab.SEEDS, (0.40, 0.35, 0.38))]
    text = lab.report(records)
    assert "| ppo | greedy em at iteration 50 | 0.300, 0.360, 0.330 | 0.280 to 0.380 |" in text
    assert "| exercises | greedy em gained by iteration 50 (points) | +15.6, +10.6, +13.6 | +8.6 to +17.6 |" in text
    assert "| ippo | greedy em at iteration 50 | 0 of 3 runs | not run |" in text


def test_every_range_the_lab_sheet_quotes_is_one_its_runs_gave():
    import re
    sheet = (ROOT / "docs" / "lab.md").read_text()
    ranges = (EXPERIMENTS / "lab-sheet" / "ranges.md").read_text()
    measured = set(re.findall(r"\| ([+-]?\d+\.\d+ to [+-]?\d+\.\d+) \|", ranges))
    quoted = re.findall(r"[+-]?\d+\.\d+ to [+-]?\d+\.\d+", sheet)
    assert quoted and set(quoted) <= measured, set(quoted) - measured


def test_rollout_selection_report_comes_from_its_records():
    rules = load("rollout-selection", "compare_rules")
    costs = rules.json.loads(rules.COSTS.read_text())["seconds_per_iteration"] if rules.COSTS.exists() else {}
    assert rules.report(rules.read_records(), costs) == (EXPERIMENTS / "rollout-selection" / "report.md").read_text()


def test_rollout_selection_decides_the_readme_claims_paired_by_seed(monkeypatch):
    rules = load("rollout-selection", "compare_rules")
    monkeypatch.setattr(rules, "TEST_SEEDS", [0, 1, 2])
    flat = [0.4] * 16
    records = []
    for s in range(3):
        records += [fake_record("ppo", s, flat, 100), fake_record("ippo", s, [0.4 + 0.01 * (s + 1)] * 16, 100),
                    fake_record("binary", s, [0.4 + 0.01 * (s + 1) - 0.001] * 16, 100),   # I-PPO 0.1 pt ahead each seed
                    fake_record("random", s, [0.5 + 0.01 * s] * 16, 100),                  # I-PPO 9 pt behind each seed
                    fake_record("ppo", s, [0.3] * 16, 100, noise=0.2),                     # PPO loses 10 pt to noise
                    fake_record("ippo", s, [0.35 - 0.01 * s] * 16, 100, noise=0.2)]        # I-PPO loses 6, 8, 10
    text = "\n".join(rules.claims(records))
    assert "| reweighting beats the binary filter: final em, I-PPO - binary | 3 | +0.1 ± 0.0 pt, held |" in text
    assert "| influence beats the random filter: final em, I-PPO - random | 3 | -9.0 ± 0.0 pt, reversed |" in text
    # under noise I-PPO - PPO = 5, 4, 3 points: +4.0 ± 2.5
    assert "| I-PPO beats PPO under 20% reward noise: final em, I-PPO - PPO | 3 | +4.0 ± 2.5 pt, held |" in text
    # lost to noise: I-PPO -6, -8, -10; PPO -10 each: +4, +2, 0 -> +2.0 ± 5.0, not shown
    assert "I-PPO's - PPO's | 3 | +2.0 ± 5.0 pt, not shown |" in text
    assert "| 0 | n/a |" in "\n".join(rules.claims([r for r in records if r["arm"] == "ppo"]))
    # a phase under way: its numbers, no verdict on 2 of the design's 3 seeds
    partial = "\n".join(rules.claims([r for r in records if r["seed"] < 2]))
    assert "I-PPO - random | 2 | -9.0 ± 0.0 pt, 2 of 3 seeds, not judged |" in partial
    assert "(1 of 3 seeds, not judged)" in rules.report([r for r in records if r["seed"] == 0], {})
