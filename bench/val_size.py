"""Does a larger validation set make I-PPO learn? --val-size 32 (the recipe's) against 256, on
held-out training rows.

Why: the filter diagnostic (docs/filter-signal.md) found that the score tells faithful from
unfaithful reasoning only with 256 validation solutions, and the fair test (docs/fair-test.md)
that I-PPO's updates fit its 32 validation solutions while test accuracy stalls. This script
decides the default on validation data; the test split is not looked at.

Fixed before any run:

  runs          I-PPO, configs/tiny.toml, the fair test's settings (--passes shared, lr 1e-3:
                I-PPO's tuned rate in docs/fair-test-tuned.json), ITERATIONS iterations,
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
and I-PPO - PPO paired by seed with its 95% t-interval.

Resumable (a finished run is kept, a started one continues); two runs at a time, one thread
each, as the fair test.

    HF_HUB_OFFLINE=1 python bench/val_size.py --out runs/val-size                 # dev runs, then report
    HF_HUB_OFFLINE=1 python bench/val_size.py --out runs/val-size --phase test    # the test-split runs
    HF_HUB_OFFLINE=1 python bench/val_size.py --out runs/val-size --report        # only the report
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fair_test import PASSES, RECIPE, read_metrics, run_all  # noqa: E402
from compare import finished, half_width_95  # noqa: E402

ITERATIONS = 150
SEEDS = [0, 1, 2]
VAL_SIZES = [32, 256]
LR = 1e-3
SCORED = range(50, ITERATIONS + 1, 10)     # the evaluations the rule averages
TEST_SEEDS = [0, 1, 2, 3, 4]
TEST_METHODS = {"ppo": ["--influence", "off"], "ippo": ["--influence", "on"]}


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


def test_report(out: Path) -> str:
    runs = {}
    for j in test_jobs(out):
        if finished(j):
            evals = [r for r in read_metrics(j["run_dir"]) if "eval_accuracy" in r]
            runs[j["method"], j["seed"]] = {"start": evals[0]["eval_accuracy"], "final": evals[-1]["eval_accuracy"],
                                            "mean": statistics.mean(r["eval_accuracy"] for r in evals[1:]),
                                            "unfaithful": evals[-1].get("eval_unfaithful_of_correct")}
    if not runs:
        return ""
    lines = ["Test split (500 problems), --val-size 256 for both methods:", "",
             "| method | seed | em at 0 | final em | mean em over evaluations 10-150 | unfaithful share of correct, final |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {m} | {s} | {r['start']:.3f} | {r['final']:.3f} | {r['mean']:.3f} | {r['unfaithful']:.2f} |"
              for (m, s), r in sorted(runs.items())]
    seeds = [s for s in TEST_SEEDS if ("ppo", s) in runs and ("ippo", s) in runs]
    lines.append("")
    for key in ("final", "mean", "unfaithful"):
        diffs = [runs["ippo", s][key] - runs["ppo", s][key] for s in seeds]
        if diffs:
            h = f" ± {half_width_95(diffs):.3f}" if len(diffs) > 1 else ""
            lines.append(f"- I-PPO - PPO, {key}, paired by seed ({len(diffs)} seeds): "
                         f"**{statistics.mean(diffs):+.3f}{h}** ({', '.join(f'{d:+.3f}' for d in diffs)})")
    return "\n".join(lines) + "\n"


def report(out: Path) -> str:
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
    return "\n".join(lines) + "\n\n" + test_report(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/val-size"))
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--hours", type=float, default=24.0, help="start no run after this many hours")
    parser.add_argument("--phase", choices=("dev", "test"), default="dev")
    parser.add_argument("--report", action="store_true", help="only write the report from the finished runs")
    args = parser.parse_args()
    if not args.report:
        todo = jobs(args.out) if args.phase == "dev" else test_jobs(args.out)
        failed = run_all(todo, args.parallel, time.time() + 3600 * args.hours)
        if failed:
            print(f"[val-size] failed: {', '.join(failed)}", file=sys.stderr)
    text = report(args.out)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
