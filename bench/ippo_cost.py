"""What influence costs per iteration: I-PPO against PPO on the README's first command.

    HF_HUB_OFFLINE=1 python bench/ippo_cost.py                      # 20 iterations of each, seed 0
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --iterations 3       # a quick check
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --recipe gsm8k-270m --iterations 5

--recipe tiny (the default) is the README's first command (the tiny world's recipe,
bench/tiny_learns.RECIPE: 32 prompts x 4 samples = 128 episodes, one minibatch, 2 epochs);
--recipe gsm8k-270m is the README's GSM8K command on the offline Gemma-3-270M (4 prompts x 2
samples, 128 new tokens, 8 validation solutions two at a time, train.py's other defaults). Each
runs with --influence off and then on, same seed, one after the other, no evaluation, and reads
the per-phase seconds of every iteration from each run's metrics.jsonl. Prints, per phase, the
median over iterations 2..--iterations (iteration 1 warms up), the medians of the iteration
totals and I-PPO's total over PPO's, and I-PPO's mean kept fraction (its update runs on the kept
episodes only). The totals exclude the checkpoint written after each iteration (the same for
both).

It times the machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import train  # noqa: E402
from tiny_learns import RECIPE  # noqa: E402

# The README's GSM8K command on the offline Gemma-3-270M (its first command before the tiny world).
GSM8K_270M = ["--prompts-per-iter", "4", "--samples-per-prompt", "2", "--max-new-tokens", "128",
              "--truncation-penalty", "0.1", "--val-size", "8", "--val-batch-size", "2", "--no-progress", "--no-plots"]
RECIPES = {"tiny": RECIPE, "gsm8k-270m": GSM8K_270M}
PHASES = ["rollout", "reward", "advantages", "influence", "update"]
METHODS = {"PPO": ["--influence", "off"], "I-PPO": ["--influence", "on"]}


def run(recipe: list[str], flags: list[str], iterations: int, seed: int, out: Path) -> list[dict]:
    """train.py with `recipe` (no evaluation); metrics.jsonl's iteration rows."""
    argv = [*recipe, "--iterations", str(iterations), "--seed", str(seed), "--eval-every", "0",
            "--run-dir", str(out), *flags]
    run_dir = train.main(argv)
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "seconds" in r]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="tiny")
    parser.add_argument("--out", default=None, help="also write the medians as JSON here")
    args = parser.parse_args(argv)
    result = {}
    for name, flags in METHODS.items():
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(RECIPES[args.recipe], flags, args.iterations, args.seed, Path(tmp) / "run")
        later = rows[1:] or rows
        result[name] = {**{p: statistics.median(r["seconds"].get(p, 0.0) for r in later) for p in PHASES},
                        "total": statistics.median(sum(r["seconds"].values()) for r in later),
                        "kept_fraction": statistics.mean(r.get("kept_fraction", 1.0) for r in later)}
    result["ratio"] = result["I-PPO"]["total"] / result["PPO"]["total"]
    result["run"] = {"recipe": args.recipe, "flags": RECIPES[args.recipe], "iterations": args.iterations,
                     "seed": args.seed}
    print(f"\n{args.recipe}: seconds per iteration, medians of iterations 2..{args.iterations}, seed {args.seed}\n")
    print("| | " + " | ".join([*PHASES, "total", "kept fraction"]) + " |\n" + "|---" * (len(PHASES) + 3) + "|")
    for name in METHODS:
        r = result[name]
        print(f"| {name} | " + " | ".join(f"{r[p]:.2f}" for p in PHASES) + f" | {r['total']:.2f} | {r['kept_fraction']:.2f} |")
    print(f"\nI-PPO / PPO per iteration: {result['ratio']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
