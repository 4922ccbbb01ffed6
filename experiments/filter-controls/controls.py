"""What does I-PPO's filter add beyond its validation solutions? The controls, run and reported.

The design (arms, seeds, budget, the numbers each claim is judged on) is fixed in README.md,
beside this file, before the first run. Two phases:

    tune   on held-out training rows (--eval-split dev, 400 rows): the SFT control's learning
           rate and batch, the PPO-plus-SFT coefficient, I-PPO's learning rate at 256
           validation solutions; seeds 0-1; the rule: highest mean dev em over the evaluations
           at iterations 50-150, averaged over the seeds
    test   the test split (500 problems): PPO, I-PPO and the controls, seeds 0-4 (the I-PPO
           variants screened at 0-2, then run to 4), with the settings the tune phase chose

Every run is train.py on configs/tiny.toml in a process of its own, one thread, PARALLEL at a
time; a finished run is kept, a started one resumes. Each finished run is summarised (with its
curves, the machine and the code version) into records.jsonl beside this file, so the report
outlives the run directories:

    HF_HUB_OFFLINE=1 python experiments/filter-controls/controls.py --out /tmp/controls --phase tune
    HF_HUB_OFFLINE=1 python experiments/filter-controls/controls.py --out /tmp/controls --phase test
    python experiments/filter-controls/controls.py --report      # tables and figure from records.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]

from compare import half_width_95  # noqa: E402
from runner import code_version, machine, run_all  # noqa: E402

RECORDS = HERE / "records.jsonl"
ITERATIONS = 150
RECIPE = [str(ROOT / "configs" / "tiny.toml"), "--eval-every", "10", "--no-plots", "--no-progress"]
SHARED = ["--speedups", "all"]           # exact (tests/test_passes.py), and faster: the PPO and I-PPO arms
                                         # (the records were made when this flag was --passes shared)
DEV = ["--eval-split", "dev", "--eval-limit", "400"]
TEST = ["--eval-limit", "500"]
SCORED = range(50, ITERATIONS + 1, 10)     # the evaluations the tune rule averages
# The I-PPO variants were screened at seeds 0-2, then run to 5 seeds: at 3 their difference from PPO
# in final em held 0 with a half-width of about 7 points (the design's "run to 5 where the interval needs it").
TUNE_SEEDS, TEST_SEEDS, VARIANT_SEEDS = [0, 1], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]

# The candidates of the tune phase, {arm: {setting name: flags}}.
SFT_VAL = ["--algo", "sft", "--sft-data", "val"]
TUNE = {
    "sft-val": {f"lr{lr}-batch{b}": [*SFT_VAL, "--lr", lr, "--sft-batch-size", b]
                for lr in ("3e-4", "1e-3", "3e-3") for b in ("16", "64")},
    "ppo-sft": {f"coef{c}": [*SHARED, "--influence", "off", "--sft-coef", c, "--sft-batch-size", "32"]
                for c in ("0.1", "0.3", "1")},
    "ippo-lr": {f"lr{lr}": [*SHARED, "--influence", "on", "--lr", lr] for lr in ("5e-4", "1e-3", "2e-3")},
}
# evaluate.py on each test run's final adapters: maj@8 by the fair test's protocol
FINAL_EVAL = ["--dataset", "arith", "--arith-terms", "3", "--metrics", "em,maj@8", "--samples", "8",
              "--temperature", "1.0", "--max-new-tokens", "40", "--limit", "0", "--batch-size", "128", "--seed", "0",
              "--no-progress"]


# ----------------------------------------------------------------------------- the runs

def tune_jobs(out: Path) -> list[dict]:
    return [job(out / "tune" / f"{arm}-{name}-seed{s}", arm, s, "tune", [*flags, *DEV], setting=name)
            for arm, settings in TUNE.items() for name, flags in settings.items() for s in TUNE_SEEDS]


def chosen(records: list[dict]) -> dict[str, str]:
    """{arm: the setting the tune rule picks}, over the finished tune runs (all seeds needed)."""
    picks = {}
    for arm, settings in TUNE.items():
        scores = {}
        for name in settings:
            runs = [r for r in records if r["phase"] == "tune" and r["arm"] == arm and r["setting"] == name]
            if len(runs) == len(TUNE_SEEDS):
                scores[name] = statistics.mean(r["scored_mean"] for r in runs)
        if len(scores) == len(settings):
            picks[arm] = max(settings, key=lambda name: scores[name])     # ties: the first listed
    return picks


def test_jobs(out: Path, picks: dict[str, str]) -> list[dict]:
    """The test-split runs, in the order they are run: the arms that need no tuning first."""
    jobs = []
    for s in TEST_SEEDS:
        keep = ["--keep-checkpoints", "200"] if s == 0 else []       # the alignment measurement reads them
        jobs.append(job(out / "test" / f"ppo-seed{s}", "ppo", s, "test", [*SHARED, "--influence", "off", *keep, *TEST]))
        jobs.append(job(out / "test" / f"ippo-seed{s}", "ippo", s, "test", [*SHARED, "--influence", "on", *keep, *TEST]))
    for s in VARIANT_SEEDS:
        jobs.append(job(out / "test" / f"ippo-rewhiten-seed{s}", "ippo-rewhiten", s, "test",
                        [*SHARED, "--influence", "on", "--rewhiten-kept", *TEST]))
        jobs.append(job(out / "test" / f"ippo-noclip-seed{s}", "ippo-noclip", s, "test",
                        [*SHARED, "--influence", "on", "--max-grad-norm", "0", *TEST]))
    for s in TEST_SEEDS:   # the cheaper, inexact g_val and I-PPO at its code version (README: "A cheaper g_val")
        jobs.append(job(out / "test" / f"ippo-rerun-seed{s}", "ippo-rerun", s, "test",
                        [*SHARED, "--influence", "on", *TEST]))
        jobs.append(job(out / "test" / f"ippo-subset-seed{s}", "ippo-subset", s, "test",
                        [*SHARED, "--influence", "on", "--val-subset", "64", *TEST]))
    if "sft-val" in picks:
        for s in TEST_SEEDS:
            sft = job(out / "test" / f"sft-val-seed{s}", "sft-val", s, "test",
                      [*TUNE["sft-val"][picks["sft-val"]], *TEST], setting=picks["sft-val"])
            jobs.append(sft)
            jobs.append(job(out / "test" / f"sft-then-ppo-seed{s}", "sft-then-ppo", s, "test",
                            [*SHARED, "--influence", "off", "--init-adapter", str(sft["run_dir"]), *TEST],
                            after=sft["name"]))
    if "ppo-sft" in picks:
        jobs += [job(out / "test" / f"ppo-sft-seed{s}", "ppo-sft", s, "test",
                     [*TUNE["ppo-sft"][picks["ppo-sft"]], *TEST], setting=picks["ppo-sft"]) for s in TEST_SEEDS]
    if picks.get("ippo-lr", "lr1e-3") != "lr1e-3":     # at 1e-3 the arm is I-PPO itself
        jobs += [job(out / "test" / f"ippo-lr-seed{s}", "ippo-lr", s, "test",
                     [*TUNE["ippo-lr"][picks["ippo-lr"]], *TEST], setting=picks["ippo-lr"]) for s in VARIANT_SEEDS]
    return jobs


def job(run_dir: Path, arm: str, seed: int, phase: str, flags: list[str], setting: str = "", after: str = "") -> dict:
    return {"name": run_dir.name if phase == "test" else f"tune-{run_dir.name}", "arm": arm, "seed": seed,
            "phase": phase, "setting": setting, "run_dir": run_dir, "after": after,
            "iterations": ITERATIONS, "argv": [*RECIPE, *flags, "--seed", str(seed)]}


def finished(job: dict) -> bool:
    """Recorded in records.jsonl already, or its run directory holds the last iteration."""
    if any(r["name"] == job["name"] for r in read_records()):
        return True
    path = job["run_dir"] / "metrics.jsonl"
    return path.exists() and any(json.loads(line).get("iteration") == ITERATIONS
                                 for line in path.read_text().splitlines() if line)


# ----------------------------------------------------------------------------- the records

def faithful(row: dict) -> float | None:
    """Faithful accuracy of one evaluation: correct answers with faithful reasoning, of all."""
    return row.get("eval_faithful_accuracy")


def final_eval(job: dict) -> dict | None:
    """maj@8 (and sampled em) of the run's final adapters, by evaluate.py, computed once."""
    adapter = job["run_dir"] / "checkpoints" / f"iter_{ITERATIONS:06d}"
    path = job["run_dir"] / "final-eval.json"
    if not adapter.exists():
        return None
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", "tiny-arith", *FINAL_EVAL,
                        "--adapter", str(adapter), "--out", str(path)], cwd=ROOT, check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(path.read_text())["metrics"]["maj@8"]["value"]


def summarize(job: dict) -> dict:
    """One finished run: its curves and the numbers the claims are judged on."""
    rows = [json.loads(line) for line in (job["run_dir"] / "metrics.jsonl").read_text().splitlines() if line]
    evals = [r for r in rows if "eval_accuracy" in r]
    train_rows = [r for r in rows if r.get("iteration", 0) > 0]
    kept = [r["kept_fraction"] for r in train_rows if "kept_fraction" in r]
    seconds = [sum(v for k, v in r["seconds"].items() if k != "eval") for r in train_rows[1:]]
    norms = [r["grad_norm_first"] for r in train_rows[:10] if "grad_norm_first" in r]
    return {"name": job["name"], "arm": job["arm"], "seed": job["seed"], "phase": job["phase"],
            "setting": job["setting"], "machine": machine(), "code": code_version(),
            "final": evals[-1]["eval_accuracy"], "final_faithful": faithful(evals[-1]),
            "final_unfaithful": evals[-1].get("eval_unfaithful_of_correct"),
            "start": evals[0]["eval_accuracy"], "start_faithful": faithful(evals[0]),
            "mean": statistics.mean(r["eval_accuracy"] for r in evals[1:]),
            "scored_mean": statistics.mean(r["eval_accuracy"] for r in evals if r["iteration"] in SCORED),
            "maj8": final_eval(job) if job["phase"] == "test" else None,
            "kept_first10": statistics.mean(kept[:10]) if kept else None,
            "kept_last10": statistics.mean(kept[-10:]) if kept else None,
            "grad_norm_first10": statistics.mean(norms) if norms else None,
            "seconds_per_iteration": statistics.median(seconds) if seconds else None,
            "curve": {str(r["iteration"]): [r["eval_accuracy"], faithful(r), r.get("eval_unfaithful_of_correct")]
                      for r in evals}}


def read_records(path: Path = RECORDS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def record(job: dict, path: Path = RECORDS) -> None:
    """Add the run's summary to records.jsonl, once (a run already recorded is left as it is)."""
    records = read_records(path)
    if any(r["name"] == job["name"] for r in records):
        return
    with open(path, "a") as f:
        f.write(json.dumps(summarize(job)) + "\n")


# ----------------------------------------------------------------------------- the report

ARMS = {"ppo": "PPO", "ippo": "I-PPO", "sft-val": "SFT on the validation solutions",
        "ppo-sft": "PPO + SFT term on them", "sft-then-ppo": "SFT on them, then PPO",
        "ippo-rewhiten": "I-PPO, advantages re-whitened over the kept set", "ippo-noclip": "I-PPO, no gradient clip",
        "ippo-lr": "I-PPO, learning rate tuned at 256", "ippo-rerun": "I-PPO, rerun at the subset arm's code",
        "ippo-subset": "I-PPO, g_val over a random 64 of the 256"}
# Judged against an arm other than I-PPO (aaf3c1f): {arm: the arm it is paired with}.
PAIRED_WITH = {"ippo-rerun": None, "ippo-subset": "ippo-rerun"}
JUDGED = {"final": "final greedy em", "final_faithful": "final faithful accuracy"}


def mean_ci(values: list[float], scale: float = 1.0) -> str:
    values = [v * scale for v in values if v is not None]
    if len(values) < 2:
        return "n/a" if not values else f"{values[0]:.3f} (1 seed)"
    return f"{statistics.mean(values):.3f} ± {half_width_95(values):.3f}"


def verdict(diffs: list[float]) -> str:
    if len(diffs) < 2:
        return "too few seeds"
    low, high = statistics.mean(diffs) - half_width_95(diffs), statistics.mean(diffs) + half_width_95(diffs)
    return "I-PPO ahead" if low > 0 else "control ahead" if high < 0 else "no difference shown"


def report(records: list[dict]) -> str:
    tune = [r for r in records if r["phase"] == "tune"]
    test = [r for r in records if r["phase"] == "test"]
    lines = ["## Tune phase (dev split, 400 held-out training rows)", "",
             "| arm | setting | seed | mean dev em, iterations 50-150 | final dev em |", "|---|---|---|---|---|"]
    lines += [f"| {r['arm']} | {r['setting']} | {r['seed']} | {r['scored_mean']:.3f} | {r['final']:.3f} |"
              for r in sorted(tune, key=lambda r: (r["arm"], r["setting"], r["seed"]))]
    lines += ["", "Chosen: " + ", ".join(f"{arm} {name}" for arm, name in chosen(records).items()), "",
              "## Test split (500 problems), 150 iterations", "",
              "| arm | seeds | final em | final faithful accuracy | unfaithful share | maj@8 | kept fraction, last 10 "
              "| grad norm, first 10 | s/iteration |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, words in ARMS.items():
        runs = [r for r in test if r["arm"] == arm]
        if runs:
            lines.append(f"| {words} | {', '.join(str(r['seed']) for r in sorted(runs, key=lambda r: r['seed']))} | "
                         + " | ".join(mean_ci([r[k] for r in runs]) for k in
                                      ("final", "final_faithful", "final_unfaithful", "maj8", "kept_last10",
                                       "grad_norm_first10", "seconds_per_iteration")) + " |")
    lines += ["", "I-PPO minus each control, paired by seed (mean ± 95% t half-width, in points):", "",
              "| control | seeds | " + " | ".join(JUDGED.values()) + " |", "|---|---|" + "---|" * len(JUDGED)]
    for arm, words in ARMS.items():
        against = PAIRED_WITH.get(arm, "ippo")
        ippo = {r["seed"]: r for r in test if r["arm"] == against}
        runs = {r["seed"]: r for r in test if r["arm"] == arm}
        seeds = sorted(set(runs) & set(ippo))
        if arm == "ippo" or against is None or not seeds:
            continue
        if against != "ippo":
            words = f"{words} (against {ARMS[against]})"
        cells = []
        for key in JUDGED:
            diffs = [100 * (ippo[s][key] - runs[s][key]) for s in seeds]
            cells.append(f"{mean_ci(diffs)} ({verdict(diffs)})")
        lines.append(f"| {words} | {', '.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    lines += ["", "Every run:", "", "| run | machine | code | final em | faithful | unfaithful | maj@8 |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['machine']} | {r['code']} | {r['final']:.3f} | {r['final_faithful']:.3f} | "
              f"{r['final_unfaithful']:.3f} | {'n/a' if r['maj8'] is None else format(r['maj8'], '.3f')} |"
              for r in test]
    return "\n".join(lines) + "\n"


def figure(records: list[dict], path: Path) -> None:
    """Greedy em and faithful accuracy against iteration, one line per arm (mean over seeds) with
    its 95% band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    test = [r for r in records if r["phase"] == "test"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for column, (ax, title) in enumerate(zip(axes, ("greedy exact match", "faithful accuracy"))):
        for arm, words in ARMS.items():
            runs = [r for r in test if r["arm"] == arm]
            if not runs:
                continue
            its = sorted({int(k) for r in runs for k in r["curve"]})
            ys = [[r["curve"][str(i)][column] for r in runs if str(i) in r["curve"]] for i in its]
            mean = [statistics.mean(y) for y in ys]
            half = [half_width_95(y) if len(y) > 1 else 0.0 for y in ys]
            line, = ax.plot(its, mean, label=f"{words} ({len(runs)} seeds)")
            ax.fill_between(its, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                            color=line.get_color(), alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("tiny world, configs/tiny.toml, test split (500 problems); bands: 95% t over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/filter-controls"), help="where the runs go")
    parser.add_argument("--phase", choices=("tune", "test"), help="run this phase's unfinished runs")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hours", type=float, default=24.0, help="start no run after this many hours")
    parser.add_argument("--report", action="store_true", help="write report.md and controls.png from records.jsonl")
    args = parser.parse_args(argv)
    if args.phase:
        jobs = tune_jobs(args.out) if args.phase == "tune" else test_jobs(args.out, chosen(read_records()))
        run_all(jobs, args.parallel, time.time() + 3600 * args.hours, "controls", done=finished, on_finish=record)
    if args.report or not args.phase:
        records = read_records()
        (HERE / "report.md").write_text(report(records))
        if any(r["phase"] == "test" for r in records):
            figure(records, HERE / "controls.png")
        print(report(records))


if __name__ == "__main__":
    main()
