"""How far the sampler's log-probs of its own tokens are from pi_old's, in fp32 and in bf16.

    HF_HUB_OFFLINE=1 python bench/sampler_drift.py                       # tiny world, 128 episodes
    HF_HUB_OFFLINE=1 python bench/sampler_drift.py --model gemma-3-270m --dataset gsm8k --prompts 4 --max-new-tokens 64

The sampler (rollout.sample) computes log-softmax(logits / T) of each token it draws, through the
KV-cache decode, one new token at a time; PPO's pi_old (rollout.token_logprobs) computes the same
quantity from one full forward over prompt and response. Same weights, same temperature: they
differ by rounding alone, and by how much depends on the dtype. This prints, per dtype, the
largest and the mean absolute gap over all response tokens; train.SAMPLER_TOLERANCE, the
threshold above which train.py warns, was set from these figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks import generate_arith, load_task, make_prompt  # noqa: E402
from model import load_policy  # noqa: E402
from offline_models import model_source  # noqa: E402
from rollout import generate_rollouts, token_logprobs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--dataset", default="arith")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    if args.dataset == "arith":
        questions = [e.question for e in generate_arith("train", terms=3)[:args.prompts]]
    else:
        questions = [e.question for e in load_task(args.dataset, "train", source="local").examples[:args.prompts]]
    prompts = [make_prompt(q, args.dataset) for q in questions]
    rows = {}
    for dtype in args.dtypes.split(","):
        torch.manual_seed(0)
        policy, tok = load_policy(model_source(args.model), dtype=dtype, quiet=True)
        rollouts = generate_rollouts(policy, tok, prompts, n_samples=args.samples, max_new_tokens=args.max_new_tokens,
                                     temperature=args.temperature, seed=0, batch_size=args.prompts * args.samples,
                                     progress=False)
        with torch.no_grad():
            old, _, _ = token_logprobs(policy, rollouts, args.temperature)
        mask = rollouts.response_mask.bool()
        gap = (rollouts.sampler_logprobs - old).abs()[mask]
        rows[dtype] = {"max": gap.max().item(), "mean": gap.mean().item(), "p99": gap.quantile(0.99).item(),
                       "tokens": int(mask.sum())}
        print(f"{args.model} {dtype}: |log pi_sampler - log pi_old| over {rows[dtype]['tokens']} tokens: "
              f"max {rows[dtype]['max']:.2e}, 99th percentile {rows[dtype]['p99']:.2e}, mean {rows[dtype]['mean']:.2e}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "gaps": rows}, indent=2))


if __name__ == "__main__":
    main()
