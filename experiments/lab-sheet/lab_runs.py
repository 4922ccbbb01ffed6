"""The lab sheet's runs (docs/lab.md): each step's command at seeds 0-2, and the answer ranges.

The design, fixed before the runs: configs/tiny.toml as it is, 50 iterations, evaluation every
10 iterations on all 500 test problems (the recipe's), seeds 0, 1 and 2, the CPU, one thread a
run, two runs at a time. For each number a lab question is answered by, the range an instructor
checks against is [min, max] over the three seeds, widened by 0.02 on either side for the float
rounding of another machine (docs/lab.md says so). The arms are the sheet's steps:

    ppo        python train.py configs/tiny.toml --iterations 50
    ippo       ... --influence on
    random     ... --influence on --random-filter
    sft        ... --algo sft --sft-data val --sft-batch-size 16   (experiments/filter-controls' setting)
    exercises  the student's run of the exercises (exercises/catalog.py STUDENT_RUN)

    HF_HUB_OFFLINE=1 python experiments/lab-sheet/lab_runs.py --out runs/lab      # the 15 runs; resumable
    python experiments/lab-sheet/lab_runs.py --report                            # ranges.md from records.json

Writes records.json (per run: the evaluations, the kept fractions, minutes, machine, code
version) beside this file, and ranges.md (the ranges the sheet quotes) from the records alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(HERE.parent), str(ROOT / "exercises")]

from catalog import STUDENT_FLAGS  # noqa: E402
from runner import code_version, machine, run_all  # noqa: E402

RECIPE = str(ROOT / "configs" / "tiny.toml")
ITERATIONS, SEEDS, SLACK = 50, (0, 1, 2), 0.02
ARMS = {
    "ppo": [],
    "ippo": ["--influence", "on"],
    "random": ["--influence", "on", "--random-filter"],
    "sft": ["--algo", "sft", "--sft-data", "val", "--sft-batch-size", "16"],
    "exercises": STUDENT_FLAGS,
}
RECORDS = HERE / "records.json"


def jobs(out: Path) -> list[dict]:
    return [{"name": f"{arm}-seed{s}", "arm": arm, "seed": s, "iterations": ITERATIONS,
             "run_dir": out / f"{arm}-seed{s}", "argv": [RECIPE, *flags, "--seed", str(s)]}
            for s in SEEDS for arm, flags in ARMS.items()]


def summarize(job: dict) -> dict:
    rows = [json.loads(l) for l in (job["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    evals = {r["iteration"]: {"em": r["eval_accuracy"], "faithful": r["eval_faithful_accuracy"],
                              "unfaithful": r["eval_unfaithful_of_correct"]} for r in rows if "eval_accuracy" in r}
    kept = [r["kept_fraction"] for r in rows if "kept_fraction" in r]
    return {"name": job["name"], "arm": job["arm"], "seed": job["seed"], "evals": evals,
            "kept_first10": sum(kept[:10]) / 10 if kept else None, "kept_last10": sum(kept[-10:]) / 10 if kept else None,
            "minutes": sum(sum(r.get("seconds", {}).values()) for r in rows) / 60,
            "machine": machine(), "code": code_version()}


def record(job: dict) -> None:
    records = json.loads(RECORDS.read_text()) if RECORDS.exists() else []
    records = [r for r in records if r["name"] != job["name"]] + [summarize(job)]
    RECORDS.write_text(json.dumps(sorted(records, key=lambda r: (r["arm"], r["seed"])), indent=1) + "\n")


# The numbers the sheet's questions are answered by: (arm, label, function of a record)
NUMBERS = [
    ("ppo", "greedy em before training", lambda r: r["evals"]["0"]["em"]),
    ("ppo", "greedy em at iteration 50", lambda r: r["evals"]["50"]["em"]),
    ("ppo", "unfaithful share of the correct answers at 50", lambda r: r["evals"]["50"]["unfaithful"]),
    ("ippo", "greedy em at iteration 50", lambda r: r["evals"]["50"]["em"]),
    ("ippo", "unfaithful share of the correct answers at 50", lambda r: r["evals"]["50"]["unfaithful"]),
    ("ippo", "kept fraction, iterations 1-10", lambda r: r["kept_first10"]),
    ("ippo", "kept fraction, iterations 41-50", lambda r: r["kept_last10"]),
    ("random", "greedy em at iteration 50", lambda r: r["evals"]["50"]["em"]),
    ("random", "unfaithful share of the correct answers at 50", lambda r: r["evals"]["50"]["unfaithful"]),
    ("random", "kept fraction, iterations 41-50", lambda r: r["kept_last10"]),
    ("sft", "greedy em at iteration 50", lambda r: r["evals"]["50"]["em"]),
    ("sft", "unfaithful share of the correct answers at 50", lambda r: r["evals"]["50"]["unfaithful"]),
    ("exercises", "greedy em gained by iteration 50 (points)", lambda r: 100 * (r["evals"]["50"]["em"] - r["evals"]["0"]["em"])),
]


def report(records: list[dict]) -> str:
    lines = ["# The lab sheet's answer ranges", "",
             "Written by `python experiments/lab-sheet/lab_runs.py --report` from `records.json`. Each range is",
             f"[min, max] over seeds {', '.join(map(str, SEEDS))}, widened by {SLACK} on either side (points: by {100 * SLACK:g}).", "",
             "| step | number | seeds 0, 1, 2 | range |", "|---|---|---|---|"]
    for arm, label, value in NUMBERS:
        runs = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["seed"])
        if len(runs) < len(SEEDS):
            lines.append(f"| {arm} | {label} | {len(runs)} of {len(SEEDS)} runs | not run |")
            continue
        values = [value(r) for r in runs]
        slack = 100 * SLACK if "points" in label else SLACK
        fmt = (lambda v: f"{v:+.1f}") if "points" in label else (lambda v: f"{v:.3f}")
        lines.append(f"| {arm} | {label} | {', '.join(fmt(v) for v in values)} | "
                     f"{fmt(min(values) - slack)} to {fmt(max(values) + slack)} |")
    if not records:
        return "\n".join(lines) + "\n"
    minutes = {arm: [r["minutes"] for r in records if r["arm"] == arm] for arm in ARMS}
    lines += ["", "Minutes a run (train.py's timed phases, evaluations included; two one-thread runs at a time):",
              ", ".join(f"{arm} {min(m):.1f}-{max(m):.1f}" for arm, m in minutes.items() if m) + ".",
              "", f"Machine: {', '.join(sorted({r['machine'] for r in records}))}; code: "
              f"{', '.join(sorted({r['code'] for r in records}))}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "lab")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="only write ranges.md from records.json")
    args = parser.parse_args(argv)
    if not args.report:
        failed = run_all(jobs(args.out), args.parallel, deadline=time.time() + 1e9, tag="lab", on_finish=record)
        if failed:
            raise SystemExit(f"[lab] failed: {failed}")
    (HERE / "ranges.md").write_text(report(json.loads(RECORDS.read_text())))
    print(f"[lab] {HERE / 'ranges.md'}")


if __name__ == "__main__":
    main()
