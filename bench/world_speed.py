"""Throughput of the tiny world, first world against today's, each on its own README recipe.

    HF_HUB_OFFLINE=1 python bench/world_speed.py                 # 3 pairs of 6 iterations, seed 0
    HF_HUB_OFFLINE=1 python bench/world_speed.py --pairs 1 --iterations 3   # a quick look

The old world is tiny-arith-v1 (2-number problems, a character tokenizer, prompts of about 105
tokens) on its recipe (bench/tiny_learns.RECIPE_V1); the new one is tiny-arith (3-number
problems, a word tokenizer, prompts of about 35 tokens) on today's (bench/tiny_learns.RECIPE).
Both are PPO (--influence off), 128 episodes an iteration, no evaluation, each train.py run in a
fresh process; the seconds come from metrics.jsonl (the iteration's phases, without the
checkpoint written after it). A pair is one run of each world, alternating which goes first.
Per world: the median over iterations 2..--iterations (the first warms up) and over pairs of
the seconds per iteration, episodes per second, and tokens per second (prompt + response
tokens of the episodes); then new / old episodes per second, per pair and as a mean with its
95% t-interval. The first use of tiny-arith-v1 builds it (minutes, once, not timed).

It times the machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare import half_width_95  # noqa: E402
from tiny_learns import RECIPE, RECIPE_V1  # noqa: E402

WORLDS = {"old (tiny-arith-v1)": RECIPE_V1, "new (tiny-arith)": RECIPE}


def flag(recipe: list[str], name: str, default: str) -> str:
    return recipe[recipe.index(name) + 1] if name in recipe else default


def prompt_tokens(recipe: list[str]) -> float:
    """Mean prompt length in tokens (BOS included) over the training prompts of the recipe's world."""
    from data import generate_arith, make_prompt
    from model import load_policy

    _, tok = load_policy(flag(recipe, "--model", ""), quiet=True)
    rows = generate_arith("train", terms=int(flag(recipe, "--arith-terms", "2")))[:1000]
    return statistics.mean(len(tok(make_prompt(e.question, "arith"))["input_ids"]) for e in rows)


def run(recipe: list[str], iterations: int, seed: int, out: Path) -> list[dict]:
    argv = [*recipe, "--influence", "off", "--iterations", str(iterations), "--seed", str(seed),
            "--eval-every", "0", "--run-dir", str(out)]
    subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], check=True, stdout=subprocess.DEVNULL)
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "seconds" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    prompts = {name: prompt_tokens(recipe) for name, recipe in WORLDS.items()}   # builds v1 on first use
    per_pair = {name: [] for name in WORLDS}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = list(WORLDS) if pair % 2 == 0 else list(WORLDS)[::-1]
            for name in order:
                rows = run(WORLDS[name], args.iterations, args.seed, Path(tmp) / f"{pair}-{list(WORLDS).index(name)}")
                timed = rows[1:] if len(rows) > 1 else rows
                seconds = statistics.median(sum(r["seconds"].values()) for r in timed)
                episodes = statistics.mean(r["episodes"] for r in timed)
                response = statistics.mean(r["response_tokens"] for r in timed)
                per_pair[name].append({"seconds": seconds, "episodes": episodes, "response_tokens": response,
                                       "phases": {k: statistics.median(r["seconds"][k] for r in timed)
                                                  for k in timed[0]["seconds"]}})
                print(f"[pair {pair + 1}] {name}: {seconds:.2f} s an iteration, {episodes / seconds:.1f} episodes/s",
                      file=sys.stderr)
    table = {}
    for name, runs in per_pair.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        episodes = statistics.mean(r["episodes"] for r in runs)
        tokens = prompts[name] + statistics.mean(r["response_tokens"] for r in runs)
        table[name] = {"seconds_per_iteration": seconds, "episodes_per_s": episodes / seconds,
                       "tokens_per_episode": tokens, "prompt_tokens": prompts[name],
                       "tokens_per_s": episodes * tokens / seconds, "runs": runs}
    old, new = list(WORLDS)
    ratios = [(n["episodes"] / n["seconds"]) / (o["episodes"] / o["seconds"])
              for o, n in zip(per_pair[old], per_pair[new])]
    mean = statistics.mean(ratios)
    print(f"{'world':<22} {'s/iteration':>11} {'episodes/s':>10} {'tokens/episode':>14} {'tokens/s':>9}")
    for name, t in table.items():
        print(f"{name:<22} {t['seconds_per_iteration']:>11.2f} {t['episodes_per_s']:>10.1f} "
              f"{t['tokens_per_episode']:>14.1f} {t['tokens_per_s']:>9.0f}")
    print(f"episodes/s, new / old: pairs {', '.join(f'{r:.2f}' for r in ratios)}; mean {mean:.2f}"
          + (f" +- {half_width_95(ratios):.2f} (95% t)" if len(ratios) > 1 else ""))
    if args.out:
        Path(args.out).write_text(json.dumps({"table": table, "ratios": ratios, "mean_ratio": mean,
                                              "pairs": args.pairs, "iterations": args.iterations}, indent=2))


if __name__ == "__main__":
    main()
