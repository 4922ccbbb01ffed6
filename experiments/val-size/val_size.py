"""Does a larger validation set make I-PPO learn? --val-size 32 (the recipe's) against 256, on
held-out training rows.

Why: the filter diagnostic (experiments/filter-signal/README.md) found that the score tells
faithful from unfaithful reasoning only with 256 validation solutions, and the fair test
(experiments/fair-test/README.md) that I-PPO's updates fit its 32 validation solutions while
test accuracy stalls. This script decides the default on validation data; the test split is not
looked at.

Fixed before any run:

  runs          I-PPO, configs/tiny.toml, the fair test's settings (--passes shared, lr 1e-3:
                I-PPO's tuned rate in experiments/fair-test/tuned.json), ITERATIONS iterations,
                seeds SEEDS, --val-size 32 and 256
  measured      greedy exact match on --eval-split dev --eval-limit 400 every 10 iterations:
                the 400 training rows before the validation rows, which neither the update nor
                g_val uses. They move with --val-size, so the two arms are scored on different
                draws of the same problem generator (176 of the 400 rows are shared).
  rule          per run, the mean dev accuracy over the evaluations at iterations 50..150; the
                paired difference 256 - 32 over seeds, with its 95% t-interval. The default
                becomes 256 if the interval lies above 0; otherwise it stays 32.

Then, phase "test" (fixed before any of its runs, after the dev runs of seeds 0 and 1 had been
seen): PPO and I-PPO, both at --val-size 256 (the validation rows are left out of training for
every method, so PPO's prompts change with it), seeds TEST_SEEDS, the same settings,
greedy exact match on all 500 test problems every 10 iterations with the unfaithful share of
the correct answers. Reported: each run's start, final and mean accuracy over the evaluations,
and I-PPO - PPO paired by seed with its 95% t-interval. Added later, before any maj@8 of these
runs was seen: maj@8 of each run's final adapters by the fair test's protocol (FINAL_EVAL), and
the kept fraction of the first and last 10 iterations.

Resumable (a finished run is kept, a started one continues); two runs at a time, one thread
each, as the fair test. Each finished test-split run is summarised, with its curve and the
machine it ran on, in test-runs.json beside this file (one run a line), so the figures outlive
the run directories; report.md and test-curves.png beside it are written from that file alone,
grouped by machine. The dev runs' table is printed (and written to --out) while their run
directories exist; it has no record.

    HF_HUB_OFFLINE=1 python experiments/val-size/val_size.py --out runs/val-size                # dev runs, then report
    HF_HUB_OFFLINE=1 python experiments/val-size/val_size.py --out runs/val-size --phase test   # the test-split runs
    python experiments/val-size/val_size.py --report        # report.md and test-curves.png from test-runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fair-test"))

from fair_test import PASSES, RECIPE, final_eval, read_metrics  # noqa: E402  (the fair test's protocol)
from runner import run_all  # noqa: E402
from compare import finished, half_width_95  # noqa: E402

ITERATIONS = 150
SEEDS = [0, 1, 2]
VAL_SIZES = [32, 256]
LR = 1e-3
SCORED = range(50, ITERATIONS + 1, 10)     # the evaluations the rule averages
TEST_SEEDS = [0, 1, 2, 3, 4]
TEST_METHODS = {"ppo": ["--influence", "off"], "ippo": ["--influence", "on"]}
RECORD = HERE / "test-runs.json"
REPORT, FIGURE = HERE / "report.md", HERE / "test-curves.png"   # written from RECORD alone


def jobs(out: Path) -> list[dict]:
    return [{"name": f"val{v}-seed{s}", "val_size": v, "seed": s, "iterations": ITERATIONS,
             "run_dir": out / f"val{v}-seed{s}",
             "argv": [RECIPE, "--influence", "on", *PASSES, "--lr", f"{LR:g}", "--seed", str(s), "--val-size", str(v),
                      "--eval-split", "dev", "--eval-limit", "400", "--eval-every", "10", "--no-plots", "--no-progress"]}
            for s in SEEDS for v in VAL_SIZES]


def test_jobs(out: Path) -> list[dict]:
    return [{"name": f"test-{m}-val256-seed{s}", "method": m, "seed": s, "iterations": ITERATIONS,
             "run_dir": out / "test" / f"{m}-val256-seed{s}",
             "argv": [RECIPE, *flags, *PASSES, "--lr", f"{LR:g}", "--seed", str(s), "--val-size", "256",
                      "--eval-every", "10", "--eval-limit", "500", "--no-plots", "--no-progress"]}
            for s in TEST_SEEDS for m, flags in TEST_METHODS.items()]


def machine() -> str:
    """The CPU this process runs on, as /proc/cpuinfo names it, and its core count."""
    try:
        name = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def summarize(job: dict, where: str) -> dict:
    """One finished test-split run: start, final and mean greedy em, the final unfaithful share
    of the correct answers, the whole curve, and the machine it ran on."""
    metrics = read_metrics(job["run_dir"])
    evals = [r for r in metrics if "eval_accuracy" in r]
    best = max(evals, key=lambda r: r["eval_accuracy"])
    train_s = sum(v for r in metrics for k, v in r.get("seconds", {}).items() if k != "eval")
    kept = [r["kept_fraction"] for r in metrics if "kept_fraction" in r]
    # maj@8 of the final adapters, by the fair test's protocol (evaluate.py, 8 samples at
    # temperature 1, seed 0), where the run kept its last checkpoint
    adapter = job["run_dir"] / "checkpoints" / f"iter_{ITERATIONS:06d}"
    maj8 = final_eval(job["run_dir"] / "final-eval.json", adapter)["maj8"] if adapter.exists() else None
    return {"method": job["method"], "seed": job["seed"], "machine": where,
            "start": evals[0]["eval_accuracy"], "final": evals[-1]["eval_accuracy"],
            "best": best["eval_accuracy"], "best_iteration": best["iteration"], "train_minutes": train_s / 60,
            "kept_fraction": statistics.mean(kept) if kept else None,
            # the paper's "intrinsic early stopping": does the kept share fall as training converges?
            "kept_first10": statistics.mean(kept[:10]) if kept else None,
            "kept_last10": statistics.mean(kept[-10:]) if kept else None,
            "mean": statistics.mean(r["eval_accuracy"] for r in evals[1:]),
            "unfaithful": evals[-1].get("eval_unfaithful_of_correct"), "maj8": maj8,
            "curve": {str(r["iteration"]): r["eval_accuracy"] for r in evals},
            "unfaithful_curve": {str(r["iteration"]): r.get("eval_unfaithful_of_correct") for r in evals}}


def faithful_curve(run: dict) -> dict:
    """Faithful accuracy at each evaluation: the share of problems answered correctly with
    faithful reasoning, greedy em x (1 - the unfaithful share of the correct answers)."""
    return {i: em * (1 - (run["unfaithful_curve"].get(i) or 0.0)) for i, em in run["curve"].items()}


def figure(runs: list[dict], path: Path) -> None:
    """Greedy em, faithful accuracy and the unfaithful share of the correct answers against
    iteration, PPO and I-PPO, one thin line per seed and their mean, for the runs that kept
    their curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [r | {"faithful_curve": faithful_curve(r)} for r in runs if r.get("curve")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for method, colour, name in (("ppo", "tab:blue", "PPO"), ("ippo", "tab:red", "I-PPO")):
        mine = [r for r in runs if r["method"] == method]
        for ax, key in zip(axes, ("curve", "faithful_curve", "unfaithful_curve")):
            its = sorted(set.intersection(*(set(map(int, r[key])) for r in mine))) if mine else []
            for r in mine:
                ax.plot(its, [r[key][str(i)] for i in its], color=colour, alpha=0.25, lw=0.8)
            if its:
                ax.plot(its, [statistics.mean(r[key][str(i)] for r in mine) for i in its], color=colour, lw=2,
                        label=f"{name}, mean of {len(mine)} seeds")
    axes[0].set(xlabel="iteration", ylabel="greedy exact match, 500 test problems")
    axes[1].set(xlabel="iteration", ylabel="faithful accuracy (correct and faithful), greedy")
    axes[2].set(xlabel="iteration", ylabel="unfaithful share of the correct greedy answers")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    machines = sorted({r["machine"] for r in runs})
    fig.suptitle(f"tiny world, configs/tiny.toml (--val-size 256), thin: one seed; {'; '.join(machines)}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_record(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def update_record(out: Path, path: Path, where: str) -> list[dict]:
    """Add the finished test-split runs under `out` to the record at `path`; a run already there
    for the same method, seed and machine is replaced. Returns the record."""
    record = {(r["method"], r["seed"], r["machine"]): r for r in read_record(path)}
    for j in test_jobs(out):
        if finished(j):
            record[j["method"], j["seed"], where] = summarize(j, where)
    runs = sorted(record.values(), key=lambda r: (r["machine"], r["method"], r["seed"]))
    # One run a line: the curves would otherwise take a line per number.
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in runs) + "\n]\n")
    return runs


def cell(run: dict, key: str, form: str, missing: str = "n/a") -> str:
    return form.format(run[key]) if run.get(key) is not None else missing


def spread(values: list[float], form: str) -> str:
    """'mean ± half-width of the 95% t-interval', each formatted with `form`."""
    return f"{form.format(statistics.mean(values))} ± {form.format(half_width_95(values)).lstrip('+')}"


def test_report(runs: list[dict]) -> str:
    """The test-split table and I-PPO - PPO paired by seed, one section per machine."""
    lines = []
    for where in sorted({r["machine"] for r in runs}):
        mine = {(r["method"], r["seed"]): r for r in runs if r["machine"] == where}
        lines += [f"Test split (500 problems), --val-size 256 for both methods, on {where}:", "",
                  "| method | seed | em at 0 | best em (iteration) | final em | change | mean em over evaluations 10-150 "
                  "| unfaithful share of correct, final | final maj@8 | mean kept fraction | training min |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {m} | {s} | {r['start']:.3f} | {cell(r, 'best', '{:.3f}')}{cell(r, 'best_iteration', ' ({})', '')} "
                  f"| {r['final']:.3f} | {100 * (r['final'] - r['start']):+.1f} pt | {r['mean']:.3f} | {r['unfaithful']:.2f} "
                  f"| {cell(r, 'maj8', '{:.3f}')} | {cell(r, 'kept_fraction', '{:.2f}')} | {cell(r, 'train_minutes', '{:.1f}')} |"
                  for (m, s), r in sorted(mine.items())]
        lines.append("")
        for method in TEST_METHODS:
            done = [r for (m, _), r in sorted(mine.items()) if m == method]
            if len(done) > 1:
                change = [100 * (r["final"] - r["start"]) for r in done]
                cells = [f"final em {spread([r['final'] for r in done], '{:.3f}')}",
                         f"change {spread(change, '{:+.1f}')} pt (smallest {min(change):+.1f})",
                         f"mean em {spread([r['mean'] for r in done], '{:.3f}')}",
                         f"unfaithful share {spread([r['unfaithful'] for r in done], '{:.2f}')}"]
                if all(r.get("maj8") is not None for r in done):
                    cells.append(f"maj@8 {spread([r['maj8'] for r in done], '{:.3f}')}")
                falls = [r for r in done if r.get("kept_first10") is not None and r["kept_first10"] < 1]
                if len(falls) > 1:
                    cells.append(f"kept fraction, first 10 iterations {spread([r['kept_first10'] for r in falls], '{:.2f}')}"
                                 f" -> last 10 {spread([r['kept_last10'] for r in falls], '{:.2f}')}, change "
                                 f"{spread([r['kept_last10'] - r['kept_first10'] for r in falls], '{:+.3f}')}")
                lines.append(f"- {method}, {len(done)} seeds: " + "; ".join(cells))
        seeds = [s for s in TEST_SEEDS if ("ppo", s) in mine and ("ippo", s) in mine]
        for key in ("final", "mean", "unfaithful", "maj8"):
            diffs = [mine["ippo", s][key] - mine["ppo", s][key] for s in seeds
                     if mine["ippo", s].get(key) is not None and mine["ppo", s].get(key) is not None]
            if diffs:
                h = f" ± {half_width_95(diffs):.3f}" if len(diffs) > 1 else ""
                lines.append(f"- I-PPO - PPO, {'maj@8' if key == 'maj8' else key}, paired by seed ({len(diffs)} seeds): "
                             f"**{statistics.mean(diffs):+.3f}{h}** ({', '.join(f'{d:+.3f}' for d in diffs)})")
        lines.append("")
    return "\n".join(lines)


def report(out: Path, record: list[dict]) -> str:
    rows, score = [], {}
    for j in jobs(out):
        if not finished(j):
            continue
        metrics = read_metrics(j["run_dir"])
        dev = {r["iteration"]: r["eval_accuracy"] for r in metrics if "eval_accuracy" in r}
        kept = [r["kept_fraction"] for r in metrics if "kept_fraction" in r]
        score[j["val_size"], j["seed"]] = statistics.mean(dev[i] for i in SCORED)
        rows.append(f"| {j['val_size']} | {j['seed']} | {dev[0]:.3f} | {dev[ITERATIONS]:.3f} | "
                    f"{score[j['val_size'], j['seed']]:.3f} | {statistics.mean(kept):.2f} |")
    if not rows:        # no dev run here: the test-split section alone
        return test_report(record)
    lines = ["| --val-size | seed | dev em at 0 | dev em at 150 | mean dev em, iterations 50-150 | mean kept fraction |",
             "|---|---|---|---|---|---|", *rows, ""]
    seeds = [s for s in SEEDS if all((v, s) in score for v in VAL_SIZES)]
    if seeds:
        diffs = [score[256, s] - score[32, s] for s in seeds]
        mean = statistics.mean(diffs)
        if len(diffs) == len(SEEDS):
            h = half_width_95(diffs)
            verdict = f" ± {h:.3f}** (95% t-interval): " + ("the default becomes 256" if mean - h > 0 else
                                                            "the default stays 32")
        else:
            verdict = f"**: {len(diffs)} of {len(SEEDS)} seeds done, no decision yet"
        lines.append(f"256 - 32, paired by seed ({', '.join(f'{d:+.3f}' for d in diffs)}): **{mean:+.3f}{verdict}.")
    return "\n".join(lines) + "\n\n" + test_report(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/val-size"))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hours", type=float, default=24.0, help="start no run after this many hours")
    parser.add_argument("--phase", choices=("dev", "test"), default="dev")
    parser.add_argument("--report", action="store_true", help="run nothing: the record of the finished runs "
                        "(if any are in --out), then report.md and test-curves.png from it")
    parser.add_argument("--record", type=Path, default=RECORD, help="the test-split runs' summaries (JSON)")
    args = parser.parse_args()
    if not args.report:
        todo = jobs(args.out) if args.phase == "dev" else test_jobs(args.out)
        failed = run_all(todo, args.parallel, time.time() + 3600 * args.hours, "val-size")
        if failed:
            print(f"[val-size] failed: {', '.join(failed)}", file=sys.stderr)
    record = update_record(args.out, args.record, machine())
    REPORT.write_text(test_report(record))
    figure(record, FIGURE)
    text = report(args.out, record)
    print(text)
    if args.out.exists():
        (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
