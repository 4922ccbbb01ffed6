"""Accuracy of a policy on a benchmark: greedy decoding, exact match on the final answer.

Public functions:
    evaluate(policy, tokenizer, examples, task, ...) -> dict with accuracy, counts and
                                                        per-problem predictions
CLI:
    python evaluate.py --model gemma-3-270m [--adapter RUN_DIR/checkpoints/latest]
                       --dataset gsm8k [--limit 50]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import GenerationConfig

from model import OFFLINE_DEFAULT, eos_token_ids, load_adapter, load_policy, read_adapter_config
from reward import extract_answer, is_correct, load_task, make_prompt
from rollout import encode_prompts


@torch.no_grad()
def evaluate(policy, tokenizer, examples, task: str, *, max_new_tokens: int = 256, batch_size: int = 16,
             progress: bool = True) -> dict:
    """Greedy exact match. Returns {"accuracy", "stderr", "n", "n_correct", "n_unparsed",
    "n_truncated", "predictions": [{question, gold, response, pred, correct, truncated}]}.
    stderr is the binomial standard error sqrt(acc (1 - acc) / n)."""
    gen_config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                  eos_token_id=eos_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
    eos = torch.tensor(eos_token_ids(tokenizer))
    predictions = []
    for s in tqdm(range(0, len(examples), batch_size), desc="eval", unit="batch", disable=not progress, leave=False):
        batch = examples[s:s + batch_size]
        ids, mask = encode_prompts(tokenizer, [make_prompt(e.question, task) for e in batch])
        out = policy.lm.generate(input_ids=ids.to(policy.device), attention_mask=mask.to(policy.device),
                                 generation_config=gen_config)[:, ids.shape[1]:].cpu()
        for e, tokens in zip(batch, out):
            is_eos = torch.isin(tokens, eos)
            end = int(is_eos.long().argmax()) if is_eos.any() else len(tokens)
            response = tokenizer.decode(tokens[:end], skip_special_tokens=True)
            pred = extract_answer(response, task)
            predictions.append({"question": e.question, "gold": e.gold, "response": response, "pred": pred,
                                "correct": is_correct(pred, e.gold, task), "truncated": not bool(is_eos.any())})
    n = len(predictions)
    n_correct = sum(p["correct"] for p in predictions)
    accuracy = n_correct / max(n, 1)
    return {"accuracy": accuracy, "stderr": math.sqrt(accuracy * (1 - accuracy) / max(n, 1)), "n": n,
            "n_correct": n_correct, "n_unparsed": sum(p["pred"] is None for p in predictions),
            "n_truncated": sum(p["truncated"] for p in predictions), "predictions": predictions}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=OFFLINE_DEFAULT, help="hub id, local directory, or the offline default")
    parser.add_argument("--adapter", default=None, help="a checkpoint directory written by train.py")
    parser.add_argument("--dataset", default="gsm8k", help="task name")
    parser.add_argument("--split", default="test", help="data split")
    parser.add_argument("--data-source", default="auto", choices=["auto", "hub", "local"], help="where to load data from")
    parser.add_argument("--limit", type=int, default=50, help="evaluate the first K problems (0 = all)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation length limit")
    parser.add_argument("--batch-size", type=int, default=16, help="problems per generate() call")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--out", default="eval.json", help="where to write the results")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error("--limit must be >= 0")

    lora = read_adapter_config(args.adapter) if args.adapter else {}
    policy, tokenizer = load_policy(args.model, device=args.device,
                                    lora_targets=lora.get("targets", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                    lora_rank=lora.get("rank", 8), lora_alpha=lora.get("alpha", 16.0))
    if args.adapter:
        load_adapter(policy, args.adapter)
    task = load_task(args.dataset, args.split, args.data_source)
    examples = task.examples[:args.limit] if args.limit else task.examples
    print(f"[eval] {len(examples)} problems from {task.source}", file=sys.stderr)
    t0 = time.time()
    result = evaluate(policy, tokenizer, examples, args.dataset, max_new_tokens=args.max_new_tokens,
                      batch_size=args.batch_size)
    result["seconds"] = time.time() - t0
    result["config"] = vars(args)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"[eval] {args.dataset}/{args.split}: exact match {result['accuracy']:.3f} +- {result['stderr']:.3f} "
          f"({result['n_correct']}/{result['n']}; {result['n_unparsed']} unparsed, {result['n_truncated']} truncated) "
          f"in {result['seconds']:.0f}s -> {args.out}")


if __name__ == "__main__":
    main()
