"""Does the influence filter help? The paper's comparison in the tiny world, with error bars.

One command runs compare.py on the tiny world with everything fixed here before any result was
seen: the model tiny-arith-v1 (the first tiny world, tiny_world.py; its own SFT start), the recipe of
that world (configs/tiny-v1.toml, chosen on the validation rows), the methods PPO, GRPO, I-PPO, I-PPO with
the binary filter and the random-filter control, seeds 0-4, reward noise 0 and 0.2 (each
episode's correctness flipped with probability 0.2), and ITERATIONS iterations of 128 episodes
per run (the budget that fits the whole comparison in 90 minutes on 2 CPU cores). Final
evaluation: greedy em on all 500 arith test problems, maj@8 / pass@8 from 8 samples at T = 1 on
the first 100; the curves against iteration use greedy em on the first 200.

    python experiments/tiny-compare/tiny_compare.py                      # everything; run it again to resume
    python experiments/tiny-compare/tiny_compare.py --seeds 0 --reward-noise 0 --methods ppo,ippo   # a slice

Writes runs/tiny-compare/ (compare.md, compare-noise0.png, compare-noise0.2.png, results.json,
runs/) and prints the table; README.md beside this file quotes it, and keeps compare.md and the
two figures as the run wrote them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import compare  # noqa: E402
from config import load_recipe  # noqa: E402

RECIPE = ROOT / "configs" / "tiny-v1.toml"     # the first tiny world, as documented

# The budget, fixed from measured costs before any run (2 processes of 1 thread each: about
# 4.9 s per PPO iteration, 5.7 per I-PPO iteration, per process-share of the machine): 12
# iterations of 128 episodes per run is about 54 minutes of training for the 50 runs; the
# evaluations take about 25 more.
ITERATIONS = 12
EVAL_EVERY = 4          # greedy em on the first EVAL_LIMIT test problems at iterations 0, 4, 8, 12
EVAL_LIMIT = 200
SAMPLED_LIMIT = 100     # maj@8 and pass@8 on the first 100 test problems (8 samples each)
SEEDS = "0,1,2,3,4"
NOISE = "0,0.2"
METHODS = "ppo,grpo,ippo,ippo-binary,random-filter"


def recipe_flags() -> tuple[list[str], list[str]]:
    """The recipe's settings as flags, split into compare.py's own flags and --train-args (the
    rest), with the comparison's evaluation schedule instead of the learning runs' and without
    the settings compare.py sets for each run (the method's --influence among them)."""
    own, rest = [], []
    for name, value in load_recipe(RECIPE).items():
        if name in ("eval_every", "eval_limit", "iterations", "progress", "plots") or "--" + name in compare.OWNED:
            continue                                  # set below, or by compare.py per run
        flag = "--" + name.replace("_", "-")
        item = ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
        (own if name in compare.PASSTHROUGH else rest).extend(item)
    return own, rest + ["--no-plots"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/tiny-compare")
    parser.add_argument("--seeds", default=SEEDS)
    parser.add_argument("--reward-noise", default=NOISE)
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--parallel", type=int, default=2, help="train.py runs at a time (2 on 2 cores: measured "
                        "faster in all than one run on two threads)")
    args = parser.parse_args(argv)
    own, train_args = recipe_flags()
    start = time.time()
    compare.main([*own, "--iterations", str(ITERATIONS), "--eval-every", str(EVAL_EVERY), "--eval-limit",
                  str(EVAL_LIMIT), "--sampled-limit", str(SAMPLED_LIMIT), "--sft-iterations", "0",
                  "--seeds", args.seeds, "--reward-noise", args.reward_noise, "--methods", args.methods,
                  "--metrics", "em,maj@8,pass@8", "--final-limit", "0", "--parallel", str(args.parallel),
                  "--no-progress", "--train-args", " ".join(train_args), "--out", str(ROOT / args.out)])
    print(f"[tiny-compare] {(time.time() - start) / 60:.1f} minutes in this call")


if __name__ == "__main__":
    main()
