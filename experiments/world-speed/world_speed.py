"""Throughput of the tiny world, first world against today's, each on its own README recipe.

    HF_HUB_OFFLINE=1 python experiments/world-speed/world_speed.py --rounds 6 --out experiments/world-speed/world-speed.json
    HF_HUB_OFFLINE=1 python experiments/world-speed/world_speed.py --rounds 1 --iterations 3   # a quick look
    python experiments/world-speed/world_speed.py --report       # the table again, from world-speed.json

Three arms, each a train.py run in a fresh process, PPO (--influence off), 128 episodes an
iteration, no evaluation:
  first world, old code  the first world (tiny-arith-v1: 2-number problems, a character
                         tokenizer, prompts of about 105 tokens) on its recipe (configs/tiny-v1.toml,
                         given to the old code as flags: it reads no recipe file), run by the code
                         as it was when that world was the README's (git revision BASELINE_REV,
                         2026-12-05 08:12 UTC, extracted to a temporary folder): the baseline
  first world, today     the same world and recipe on today's code
  this world, today      tiny-arith (3-number problems, a word tokenizer, prompts of about 35
                         tokens) on today's recipe (configs/tiny.toml)
The new world over the baseline is what a user of the README's first command gains; over the
first world on today's code, what the world alone gains (today's code speeds up both worlds).
The seconds come from metrics.jsonl (the iteration's phases, without the checkpoint written
after it). A round is one run of each arm, the order rotating from round to round. Per arm: the
median over iterations 2..--iterations (the first warms up) and over rounds of the seconds per
iteration, episodes per second and tokens per second (prompt + response tokens of the
episodes); then the ratios of episodes per second, per round and as a mean with its 95%
t-interval. The first use of tiny-arith-v1 builds it (minutes, once, not timed); every arm of
the first world runs that same model.

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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from compare import half_width_95  # noqa: E402
from config import load_recipe, parse_config  # noqa: E402

RECIPE, RECIPE_V1 = ROOT / "configs" / "tiny.toml", ROOT / "configs" / "tiny-v1.toml"
RECORD = HERE / "world-speed.json"
BASELINE_REV = "46e304c"   # the last code of the first world (2026-12-05 08:12 UTC)
ARMS = ["first world, old code", "first world, today", "this world, today"]


def as_flags(recipe: Path) -> list[str]:
    """The recipe file's settings as train.py flags, for code that reads no recipe file."""
    flags = []
    for name, value in load_recipe(recipe).items():
        flag = "--" + name.replace("_", "-")
        flags += ([flag] if value else ["--no-" + flag[2:]]) if isinstance(value, bool) else [flag, str(value)]
    return flags


def prompt_tokens(recipe: Path) -> float:
    """Mean prompt length in tokens (BOS included) over the training prompts of the recipe's world."""
    from tasks import generate_arith, make_prompt
    from model import load_policy
    from offline_models import model_source

    cfg = parse_config([str(recipe)])
    _, tok = load_policy(model_source(cfg.model), quiet=True)
    rows = generate_arith("train", terms=cfg.arith_terms)[:1000]
    return statistics.mean(len(tok(make_prompt(e.question, "arith"))["input_ids"]) for e in rows)


def report(record: dict) -> str:
    """The table of the arms and the ratios of episodes per second, from a record main wrote."""
    lines = ["| arm | s/iteration | episodes/s | tokens/episode | tokens/s | phases (median s): sampling + old "
             "log-probs, update |", "|---|---|---|---|---|---|"]
    for name, t in record["table"].items():
        phases = [statistics.median(r["phases"][p] for r in t["runs"]) for p in ("rollout", "update")]
        lines.append(f"| {name} | {t['seconds_per_iteration']:.2f} | {t['episodes_per_s']:.1f} | "
                     f"{t['tokens_per_episode']:.1f} | {t['tokens_per_s']:.0f} | {phases[0]:.2f}, {phases[1]:.2f} |")
    lines.append("")
    for base, r in record["ratios"].items():
        lines.append(f"episodes/s, {ARMS[2]} / {base}: rounds {', '.join(f'{x:.2f}' for x in r['rounds'])}; "
                     f"mean {r['mean']:.2f}" + (f" ± {r['half_width_95']:.2f} (95% t)" if r["half_width_95"] else ""))
    return "\n".join(lines)


def run(code: Path, recipe: list[str], iterations: int, seed: int, out: Path) -> list[dict]:
    argv = [*recipe, "--influence", "off", "--iterations", str(iterations), "--seed", str(seed),
            "--eval-every", "0", "--run-dir", str(out)]
    subprocess.run([sys.executable, str(code / "train.py"), *argv], check=True, stdout=subprocess.DEVNULL, cwd=code)
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "seconds" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--report", action="store_true", help=f"run nothing: print the table of {RECORD.name}")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(RECORD.read_text())))
        return
    from offline_models import model_source
    v1_dir = model_source("tiny-arith-v1")                                   # builds it on first use
    baseline_recipe = as_flags(RECIPE_V1)
    baseline_recipe[baseline_recipe.index("--model") + 1] = str(v1_dir)    # the same model, by its folder
    first = prompt_tokens(RECIPE_V1)
    prompts = {ARMS[0]: first, ARMS[1]: first, ARMS[2]: prompt_tokens(RECIPE)}
    per_round = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline-code"
        baseline.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE_REV], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(baseline)], input=archive.stdout, check=True)
        arms = {ARMS[0]: (baseline, baseline_recipe), ARMS[1]: (ROOT, [str(RECIPE_V1)]), ARMS[2]: (ROOT, [str(RECIPE)])}
        for r in range(args.rounds):
            order = ARMS[r % 3:] + ARMS[:r % 3]
            for name in order:
                code, recipe = arms[name]
                rows = run(code, recipe, args.iterations, args.seed, Path(tmp) / f"{r}-{ARMS.index(name)}")
                timed = rows[1:] if len(rows) > 1 else rows
                seconds = statistics.median(sum(row["seconds"].values()) for row in timed)
                episodes = statistics.mean(row["episodes"] for row in timed)
                response = statistics.mean(row["response_tokens"] for row in timed)
                per_round[name].append({"seconds": seconds, "episodes": episodes, "response_tokens": response,
                                        "phases": {k: statistics.median(row["seconds"][k] for row in timed)
                                                   for k in timed[0]["seconds"]}})
                print(f"[round {r + 1}] {name}: {seconds:.2f} s an iteration, {episodes / seconds:.1f} episodes/s",
                      file=sys.stderr)
    table = {}
    for name, runs in per_round.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        episodes = statistics.mean(r["episodes"] for r in runs)
        tokens = prompts[name] + statistics.mean(r["response_tokens"] for r in runs)
        table[name] = {"seconds_per_iteration": seconds, "episodes_per_s": episodes / seconds,
                       "tokens_per_episode": tokens, "prompt_tokens": prompts[name],
                       "tokens_per_s": episodes * tokens / seconds, "runs": runs}
    ratios = {}
    for base in ARMS[:2]:
        per = [(n["episodes"] / n["seconds"]) / (o["episodes"] / o["seconds"])
               for o, n in zip(per_round[base], per_round[ARMS[2]])]
        ratios[base] = {"rounds": per, "mean": statistics.mean(per),
                        "half_width_95": half_width_95(per) if len(per) > 1 else None}
    record = {"table": table, "ratios": ratios, "baseline_rev": BASELINE_REV, "rounds": args.rounds,
              "iterations": args.iterations}
    print(report(record))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2))

if __name__ == "__main__":
    main()
