"""What influence costs per iteration: I-PPO against PPO on the README's first command.

    HF_HUB_OFFLINE=1 python bench/ippo_cost.py                      # 20 iterations of each, seed 0
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --iterations 3       # a quick check
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --pairs 5 --iterations 10   # 5 pairs, an interval
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --recipe gsm8k-270m --iterations 5
    HF_HUB_OFFLINE=1 python bench/ippo_cost.py --ippo-flags=--val-subset=64   # the cheaper, inexact g_val

--recipe tiny (the default) is the README's first command (the tiny world's recipe,
configs/tiny.toml: 32 prompts x 4 samples = 128 episodes, one minibatch, 2 epochs);
--recipe gsm8k-270m is the README's GSM8K command on the offline Gemma-3-270M (4 prompts x 2
samples, 128 new tokens, 8 validation solutions two at a time, train.py's other defaults). A
pair is one run with --influence off and one with it on, same seed, no evaluation, each
train.py in a fresh process; the per-phase seconds of every iteration come from each run's
metrics.jsonl. Prints, per phase, the median over iterations 2..--iterations (iteration 1 warms
up) and over pairs, the medians of the iteration totals and I-PPO's total over PPO's, and
I-PPO's mean kept fraction (its update runs on the kept episodes only). The totals exclude the
checkpoint written after each iteration (the same for both). With --recipe tiny it also times,
alone and in this process, the passes an exact I-PPO must add to PPO (pass_costs) and prints the
floor they set: (PPO + g_val + one plain forward and backward over the episodes) / PPO.

The runs are deterministic (same seed, same episodes, same updates), so repeated pairs do the
same work and differ only in how fast the machine was: with --pairs K > 1 the pairs alternate
which method runs first, and each pair's ratio (its I-PPO median total over its PPO median
total) is printed with their mean and 95% t-interval.

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

from compare import half_width_95  # noqa: E402

RECIPE = [str(ROOT / "configs" / "tiny.toml"), "--no-progress", "--no-plots"]
RECIPE_V1 = [str(ROOT / "configs" / "tiny-v1.toml"), "--no-progress", "--no-plots"]
# The README's GSM8K command on the offline Gemma-3-270M (its first command before the tiny world).
GSM8K_270M = ["--prompts-per-iter", "4", "--samples-per-prompt", "2", "--max-new-tokens", "128",
              "--truncation-penalty", "0.1", "--val-size", "8", "--val-batch-size", "2", "--no-progress", "--no-plots"]
RECIPES = {"tiny": RECIPE, "tiny-v1": RECIPE_V1, "gsm8k-270m": GSM8K_270M}
PHASES = ["rollout", "reward", "advantages", "influence", "update"]
METHODS = {"PPO": ["--influence", "off"], "I-PPO": ["--influence", "on"]}


def run(recipe: list[str], flags: list[str], iterations: int, seed: int, out: Path) -> list[dict]:
    """train.py with `recipe` (no evaluation), in a fresh process; metrics.jsonl's iteration rows."""
    argv = [*recipe, "--iterations", str(iterations), "--seed", str(seed), "--eval-every", "0",
            "--run-dir", str(out), *flags]
    subprocess.run([sys.executable, str(ROOT / "train.py"), *argv], check=True, stdout=subprocess.DEVNULL)
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "seconds" in r]


def summary(rows: list[dict]) -> dict:
    """Per-phase medians, the median total, the mean kept fraction over iterations 2.. of one run."""
    later = rows[1:] or rows
    return {**{p: statistics.median(r["seconds"].get(p, 0.0) for r in later) for p in PHASES},
            "total": statistics.median(sum(r["seconds"].values()) for r in later),
            "kept_fraction": statistics.mean(r.get("kept_fraction", 1.0) for r in later)}


def pass_costs(recipe: list[str], seed: int, repeats: int = 5) -> dict:
    """The passes I-PPO must add to PPO, each timed alone at the start policy, median of
    `repeats`: g_val (forward and backward over the validation solutions, as train.py computes
    it) and one plain forward and backward of the policy loss over an iteration's episodes
    (the samples of a prompt sharing its forward, as in the update), the least that any exact
    scoring pass can cost; and the one-pass scores as train.py computes them."""
    import time

    import torch

    import train
    from config import parse_config
    from tasks import load_task, make_prompt
    from influence import validation_gradient
    from model import load_policy, lora_parameters
    from offline_models import model_source
    from ppo import policy_loss
    from reward import reward_fn
    import speedups
    from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs
    from speedups import onepass_scores

    cfg = parse_config([*recipe, "--influence", "on", "--seed", str(seed)])
    torch.manual_seed(cfg.seed)
    policy, tok = load_policy(model_source(cfg.model), device="cpu", dtype="fp32", lora_targets=cfg.targets(),
                              lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, quiet=True)
    task = load_task(cfg.dataset, "train", cfg.data_source, arith_digits=cfg.arith_digits, arith_terms=cfg.arith_terms)
    rows, val = task.examples[:cfg.prompts_per_iter], task.examples[-cfg.val_size:]
    val_seqs = encode_pairs(tok, [make_prompt(e.question, cfg.dataset) for e in val], [e.solution for e in val])
    rollouts = generate_rollouts(policy, tok, [make_prompt(e.question, cfg.dataset) for e in rows],
                                 n_samples=cfg.samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                                 temperature=cfg.temperature, seed=seed, batch_size=cfg.gen_batch_size,
                                 progress=False)
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
        policy, rollouts, cfg.temperature, cfg.gen_batch_size, ref=False, logprobs=speedups.token_logprobs)
    buf = train.Buffer(rows, rollouts)
    buf.rewards = torch.tensor([reward_fn(t, rows[j].gold, cfg.dataset, bool(tr), 0.0, False)
                                for t, j, tr in zip(rollouts.responses, rollouts.prompt_index, rollouts.truncated)])
    advantages, *_ = train.compute_advantages(cfg, buf)
    params = lora_parameters(policy)

    def g_val():
        return validation_gradient(policy, val_seqs, cfg.val_batch_size, temperature=cfg.temperature)

    def plain_pass():   # the samples of a prompt share its forward (speedups.token_logprobs), as in the update
        logprobs, _, _ = speedups.token_logprobs(policy, rollouts, cfg.temperature)
        loss = policy_loss(logprobs, rollouts.old_logprobs, advantages, rollouts.response_mask, cfg.clip_eps).sum()
        torch.autograd.grad(loss, params)

    vector = g_val()

    def scores():
        onepass_scores(policy, rollouts, advantages, vector, clip_eps=cfg.clip_eps, temperature=cfg.temperature,
                       batch_size=cfg.micro_batch_size)

    def median_seconds(f):
        f()                                           # warm-up
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return {"g_val": median_seconds(g_val), "plain_pass": median_seconds(plain_pass),
            "onepass_scores": median_seconds(scores)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", type=int, default=1, help="pairs of runs (PPO, I-PPO), alternating which is first")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="tiny")
    parser.add_argument("--out", default=None, help="also write the medians as JSON here")
    parser.add_argument("--ippo-flags", default="", help="more train.py flags for the I-PPO runs, space-separated "
                        "(e.g. --val-subset=64)")
    args = parser.parse_args(argv)
    methods = {**METHODS, "I-PPO": [*METHODS["I-PPO"], *args.ippo_flags.split()]}
    runs = {name: [] for name in METHODS}
    for k in range(args.pairs):
        for name in (list(METHODS) if k % 2 == 0 else list(METHODS)[::-1]):
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(summary(run(RECIPES[args.recipe], methods[name], args.iterations, args.seed,
                                              Path(tmp) / "run")))
            print(f"[pair {k + 1}/{args.pairs}] {name}: {runs[name][-1]['total']:.2f} s an iteration", flush=True)
    result = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    result["ratio"] = result["I-PPO"]["total"] / result["PPO"]["total"]
    pair_ratios = [i["total"] / p["total"] for p, i in zip(runs["PPO"], runs["I-PPO"])]
    mean, half = statistics.mean(pair_ratios), (half_width_95(pair_ratios) if len(pair_ratios) > 1 else None)
    result["pairs"] = {"ratios": pair_ratios, "mean": mean, "half_width_95": half,
                       "PPO_totals": [r["total"] for r in runs["PPO"]],
                       "I-PPO_totals": [r["total"] for r in runs["I-PPO"]]}
    result["run"] = {"recipe": args.recipe, "flags": RECIPES[args.recipe], "ippo_flags": args.ippo_flags,
                     "iterations": args.iterations,
                     "seed": args.seed, "pairs": args.pairs}
    print(f"\n{args.recipe}: seconds per iteration, medians of iterations 2..{args.iterations} "
          f"(and over {args.pairs} pairs), seed {args.seed}\n")
    print("| | " + " | ".join([*PHASES, "total", "kept fraction"]) + " |\n" + "|---" * (len(PHASES) + 3) + "|")
    for name in METHODS:
        r = result[name]
        print(f"| {name} | " + " | ".join(f"{r[p]:.2f}" for p in PHASES) + f" | {r['total']:.2f} | {r['kept_fraction']:.2f} |")
    print(f"\nI-PPO{' ' + args.ippo_flags if args.ippo_flags else ''} / PPO per iteration: {result['ratio']:.2f}")
    if args.recipe == "tiny":
        passes = pass_costs(RECIPES[args.recipe], args.seed)
        floor = (result["PPO"]["total"] + passes["g_val"] + passes["plain_pass"]) / result["PPO"]["total"]
        result["passes"] = passes | {"floor": floor}
        print(f"the passes I-PPO adds, alone, median of 5 (s): g_val {passes['g_val']:.2f}, one plain forward and "
              f"backward over the episodes {passes['plain_pass']:.2f} (train.py's one-pass scores: "
              f"{passes['onepass_scores']:.2f})")
        print(f"floor of an exact I-PPO, (PPO + g_val + one plain pass) / PPO: {floor:.2f}")
    if args.pairs > 1:
        print("pair by pair: " + ", ".join(f"{x:.2f}" for x in pair_ratios) + f"; mean {mean:.3f} ± {half:.3f} (95% t)")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
