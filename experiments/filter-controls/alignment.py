"""Why the kept fraction does not fall, and what the filter keeps: two measurements on the runs
of controls.py (seed 0 of PPO and I-PPO keep a checkpoint every iteration).

1. Alignment. With the ratio at 1, episode i's score is s_i = g_i . g_val where, for an episode
   whose tokens share one advantage A_i, g_i = -A_i grad(mean_t log pi(a_t)). So
   s_i = A_i a_i with the alignment a_i = -grad(mean_t log pi(a_t)) . g_val: a_i > 0 when
   imitating the episode lowers the validation loss. The episodes are sampled from the policy
   whose gradients are taken, so E[grad log pi] = 0 and a_i is zero-mean noise around a small
   signal: the filter keeps an episode when the signs of A_i and a_i agree, and the kept
   fraction falls only if the covariance of A and a beats that noise. Measured here on fresh
   episodes (BATCHES x 128, train prompts, sampled at the recipe's temperature) at the start,
   the middle (iteration 75) and the end (150) of a PPO and an I-PPO run: the share with a_i > 0,
   the kept share (s_i > 0) of the correct and of the wrong episodes, and the kept set's
   w-weighted mean advantage (in units of the whitened advantages: PPO's, over all episodes, is 0).
   a_i is computed exactly as the one-pass score with every advantage set to 1.

2. Whole prompts. Of the prompts whose 4 samples got the same reward, how many does I-PPO keep
   or drop whole? A coin per episode (kept with the run's kept fraction p) gives
   p^4 + (1-p)^4; but identical responses to one prompt get identical scores, so the fair
   baseline is a coin per distinct response, p^d + (1-p)^d for d distinct responses. Read from
   the I-PPO runs' episodes.jsonl.

    HF_HUB_OFFLINE=1 python experiments/filter-controls/alignment.py --runs runs/filter-controls/test

writes alignment.json beside this file and prints its tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from config import parse_config  # noqa: E402
from tasks import load_task, make_prompt  # noqa: E402
from model import load_adapter, load_policy  # noqa: E402
from offline_models import model_source  # noqa: E402
from reward import reward_fn  # noqa: E402
from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs  # noqa: E402
import speedups  # noqa: E402
from speedups import onepass_scores  # noqa: E402
import draws  # noqa: E402
import train  # noqa: E402

BATCHES = 4                 # x 128 fresh episodes at each point
POINTS = (0, 75, 150)       # start, middle, end


def measure(run_dir: Path, iteration: int) -> dict:
    """Alignment, kept shares and the kept set's mean advantage on fresh episodes at the run's
    checkpoint `iteration` (0: the start policy)."""
    cfg = parse_config(["--resume", str(run_dir)])
    torch.manual_seed(cfg.seed)
    policy, tok = load_policy(model_source(cfg.model), device="cpu", dtype="fp32", lora_targets=cfg.targets(),
                              lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, quiet=True)
    if iteration:
        load_adapter(policy, run_dir / "checkpoints" / f"iter_{iteration:06d}")
    task = load_task(cfg.dataset, "train", cfg.data_source, arith_digits=cfg.arith_digits, arith_terms=cfg.arith_terms)
    train_rows, val_rows = task.examples[:-cfg.val_size], task.examples[-cfg.val_size:]
    val_seqs = encode_pairs(tok, [make_prompt(e.question, cfg.dataset) for e in val_rows],
                            [e.solution for e in val_rows], device=policy.device)
    align, score, correct, adv_mean, kept_adv = [], [], [], [], []
    for b in range(BATCHES):
        it = 10_000 + b                          # prompts and samples no training iteration drew
        rows = [train_rows[i] for i in draws.batch_indices(len(train_rows), it, cfg.prompts_per_iter, cfg.seed)]
        rollouts = generate_rollouts(policy, tok, [make_prompt(e.question, cfg.dataset) for e in rows],
                                     n_samples=cfg.samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperature, seed=it, batch_size=cfg.gen_batch_size,
                                     progress=False)
        rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
            policy, rollouts, cfg.temperature, cfg.gen_batch_size, ref=False, logprobs=speedups.token_logprobs)
        buf = train.Buffer(rows, rollouts)
        buf.rewards = torch.tensor([reward_fn(t, rows[j].gold, cfg.dataset, bool(tr), 0.0, False) for t, j, tr in
                                    zip(rollouts.responses, rollouts.prompt_index, rollouts.truncated)])
        buf.advantages, _, _, _ = train.compute_advantages(cfg, buf)
        s, g_val = train.validation_scores(0, cfg, policy, rollouts, buf.advantages, val_seqs,
                                           train.passes_for(0, cfg))
        mask = rollouts.response_mask
        a = onepass_scores(policy, rollouts, mask.clone(), g_val, clip_eps=cfg.clip_eps,
                           temperature=cfg.temperature, batch_size=cfg.micro_batch_size)
        keep = s > 0
        w = torch.where(keep, s / s[keep].mean(), torch.zeros_like(s)) if keep.any() else torch.zeros_like(s)
        token_w = w[:, None] * mask
        align += a.tolist()
        score += s.tolist()
        correct += (buf.rewards > 0).tolist()
        kept_adv.append(((buf.advantages * token_w).sum() / token_w.sum()).item() if keep.any() else float("nan"))
        adv_mean.append(((buf.advantages * mask).sum() / mask.sum()).item())
    share = lambda xs: sum(xs) / len(xs) if xs else None   # noqa: E731
    return {"iteration": iteration, "episodes": len(score),
            "positive_alignment": share([x > 0 for x in align]),
            "kept": share([x > 0 for x in score]),
            "kept_of_correct": share([s > 0 for s, c in zip(score, correct) if c]),
            "kept_of_wrong": share([s > 0 for s, c in zip(score, correct) if not c]),
            "correct": share(correct),
            "kept_weighted_mean_advantage": statistics.mean(kept_adv)}


def whole_prompts(run_dir: Path) -> dict:
    """Of the prompt groups whose samples all got one reward: the share kept or dropped whole,
    against a coin per episode and a coin per distinct response (both at the run's kept share)."""
    groups = defaultdict(list)
    for line in (run_dir / "episodes.jsonl").read_text().splitlines():
        e = json.loads(line)
        groups[(e["iteration"], e["prompt"])].append(e)
    p = statistics.mean(e["kept"] for g in groups.values() for e in g)
    same = [g for g in groups.values() if len({e["reward"] for e in g}) == 1]
    whole = [len({e["kept"] for e in g}) == 1 for g in same]
    distinct = [len({e["response"] for e in g}) for g in same]
    return {"run": run_dir.name, "kept_fraction": p, "groups_one_reward": len(same),
            "kept_or_dropped_whole": statistics.mean(whole),
            "coin_per_episode": statistics.mean(p ** len(g) + (1 - p) ** len(g) for g in same),
            "coin_per_distinct_response": statistics.mean(p ** d + (1 - p) ** d for d in distinct),
            "episodes_with_an_identical_sibling": statistics.mean(
                sum(e["response"] == f["response"] for f in g) > 1 for g in groups.values() for e in g)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, required=True, help="controls.py's test-phase folder")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = {"alignment": {}, "whole_prompts": []}
    for arm in ("ppo", "ippo"):
        out["alignment"][arm] = [measure(args.runs / f"{arm}-seed0", it) for it in POINTS]
        for row in out["alignment"][arm]:
            print(arm, json.dumps(row), flush=True)
    for run_dir in sorted(args.runs.glob("ippo-seed*")):
        if (run_dir / "episodes.jsonl").exists():
            out["whole_prompts"].append(whole_prompts(run_dir))
            print(json.dumps(out["whole_prompts"][-1]), flush=True)
    (HERE / "alignment.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
