"""What the default path (--speedups on: pi_old from its own pass, as the algorithm box has it) costs
against --speedups all (pi_old from a forward that runs anyway).

    HF_HUB_OFFLINE=1 python bench/passes_cost.py --out bench/passes-cost.json

Per recipe, train.py runs a few iterations with each path in a fresh process, the two paths
in turns (REPEATS rounds, the order swapped every round so that a busy moment of the machine
hits both alike), and the seconds of each phase are averaged over the iterations after the
first (the first warms up). Recipes: the README's first command (configs/tiny.toml, PPO), the
same with I-PPO, and configs/gsm8k-270m.toml (I-PPO on GSM8K, the offline Gemma-3-270M).
Run it alone: the figures are wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = {   # name: (train.py arguments, iterations, repeats)
    "tiny PPO (first command)": (["configs/tiny.toml"], 12, 3),
    "tiny I-PPO": (["configs/tiny.toml", "--influence", "on"], 12, 3),
    "270M GSM8K I-PPO": (["configs/gsm8k-270m.toml"], 3, 1),
}
PATHS = ("separate", "shared")


def phase_seconds(argv: list[str], run_dir: Path) -> list[dict]:
    subprocess.run([sys.executable, "train.py", *argv, "--eval-every", "0", "--no-plots", "--no-progress",
                    "--run-dir", str(run_dir)], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["seconds"] for r in rows if r["iteration"] > 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--only", default=None, help="run only the recipes whose name contains this")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (argv, iterations, repeats) in RECIPES.items():
            if args.only and args.only not in name:
                continue
            samples = {p: [] for p in PATHS}
            for r in range(repeats):
                for p in (PATHS if r % 2 == 0 else PATHS[::-1]):
                    samples[p] += phase_seconds([*argv, "--iterations", str(iterations), "--speedups", {"separate": "on", "shared": "all"}[p]],
                                                Path(tmp) / f"{len(results)}-{p}-{r}")
            results[name] = {}
            for p in PATHS:
                phases = {k: statistics.mean(s.get(k, 0.0) for s in samples[p]) for k in samples[p][0]}
                results[name][p] = {"phases": phases, "total": sum(phases.values()), "iterations": len(samples[p])}
            sep, sha = results[name]["separate"]["total"], results[name]["shared"]["total"]
            print(f"{name}: separate {sep:.2f} s/it, shared {sha:.2f} s/it, separate/shared {sep / sha:.3f}")
            for p in PATHS:
                print("   ", p, " ".join(f"{k} {v:.2f}" for k, v in results[name][p]["phases"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
