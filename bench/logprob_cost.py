"""What the log-probs of a batch cost on the 270M: token_logprobs forward (no grad) and forward +
backward over the LoRA parameters, on two GSM8K reference solutions (the last two rows of the
local training split: a g_val batch of the README's GSM8K command).

    HF_HUB_OFFLINE=1 python bench/logprob_cost.py             # the offline Gemma-3-270M
    HF_HUB_OFFLINE=1 python bench/logprob_cost.py --repeats 5

Prints the median seconds of --repeats calls after one warm-up, for the log-probs alone and for
the log-probs with the entropy (as the update asks for them), and how many of those seconds the
transformer body takes (its hidden states' forward and backward; the rest is the LM head over
the response tokens). It uses only token_logprobs's signature, so the same file times an older
commit: check one out in a worktree and run this file there. It times the machine: run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks import load_task, make_prompt  # noqa: E402
from model import load_policy, lora_parameters  # noqa: E402
from offline_models import OFFLINE_DEFAULT, model_source  # noqa: E402
from rollout import Sequences, encode_pairs, token_logprobs  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=OFFLINE_DEFAULT)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    policy, tok = load_policy(model_source(args.model), quiet=True)
    rows = load_task("gsm8k", "train", "local").examples[-2:]
    seqs = encode_pairs(tok, [make_prompt(e.question, "gsm8k") for e in rows], [e.solution for e in rows])
    width = int(seqs.response_mask.sum(1).max())          # as influence.validation_gradient trims a batch
    seqs = Sequences(seqs.prompt_ids, seqs.prompt_mask, seqs.response_ids[:, :width], seqs.response_mask[:, :width])
    params = lora_parameters(policy)

    def forward():
        with torch.no_grad():
            token_logprobs(policy, seqs, 1.0)

    def forward_backward(with_entropy: bool):
        def run():
            logprobs, _, entropy = token_logprobs(policy, seqs, 1.0, with_entropy=with_entropy)
            torch.autograd.grad(logprobs.sum(), params, allow_unused=True)   # the loss through log p only
        return run

    def body():
        start = int(seqs.prompt_mask.any(0).long().argmax())
        ids = torch.cat([seqs.prompt_ids[:, start:], seqs.response_ids], 1)
        mask = torch.cat([seqs.prompt_mask[:, start:], seqs.response_mask.long()], 1)
        hidden = policy.hidden_states(ids, mask, n_last=width + 1)
        torch.autograd.grad(hidden.float().square().sum(), params, allow_unused=True)

    result = {"response_tokens": int(seqs.response_mask.sum()), "prompt_tokens": int(seqs.prompt_mask.sum()),
              "forward": median_seconds(forward, args.repeats),
              "forward_backward": median_seconds(forward_backward(False), args.repeats),
              "forward_backward_with_entropy": median_seconds(forward_backward(True), args.repeats),
              "body_forward_backward": median_seconds(body, args.repeats)}
    print(f"{args.model}, 2 GSM8K solutions ({result['response_tokens']} response, {result['prompt_tokens']} "
          f"prompt tokens), median of {args.repeats}:")
    for key in ("forward", "forward_backward", "forward_backward_with_entropy", "body_forward_backward"):
        print(f"  {key:32s} {result[key]:.2f} s")
    return result


if __name__ == "__main__":
    main()
