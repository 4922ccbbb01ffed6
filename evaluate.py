"""The evaluation command: load a model (and a run's adapter), measure its accuracy on a
benchmark (accuracy.py: em, maj@k, pass@k, and on arith the faithful accuracy), print it with
its standard errors and write it to a JSON file.

Public functions:
    resolve_adapter(path)                            -> checkpoint directory (of a run directory: its latest)
    load_for_eval(model, adapter, device, dtype)     -> (policy, tokenizer, model, checkpoint or None)
    main(argv)                                       -> the results written to --out
CLI:
    python evaluate.py --model gemma-3-270m [--adapter RUN_DIR or RUN_DIR/checkpoints/iter_N]
                       --dataset gsm8k --metrics em,maj@8,pass@8 [--limit 50] [--samples 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import reward
import tasks
from accuracy import SAMPLED, evaluate, parse_metrics
from model import load_adapter, load_policy, read_adapter_config
from offline_models import OFFLINE_DEFAULT, model_source
from rundir import checkpoint_problems


def resolve_adapter(path: str) -> Path:
    """A checkpoint directory, or a run directory (then its checkpoints/latest)."""
    p = Path(path)
    latest = p / "checkpoints" / "latest"
    if latest.exists():
        p = p / "checkpoints" / latest.read_text().strip()
    if not (p / "adapter.json").exists():
        raise SystemExit(f"--adapter {path}: neither a checkpoint directory (with adapter.json) nor a run "
                         "directory with checkpoints/latest")
    problems = checkpoint_problems(p, required=("adapter.safetensors", "adapter.json"))
    if problems:
        raise SystemExit(f"--adapter {path}: the checkpoint {p} is damaged: {'; '.join(problems)}")
    return p


def load_for_eval(model: str | None, adapter: str | None, device: str = "auto", dtype: str = "auto"):
    """Load the policy with the LoRA layout of `adapter` (a checkpoint or run directory) and its
    weights. model None: the model the adapter was trained on, else the offline default.
    Returns (policy, tokenizer, the model loaded, checkpoint directory or None)."""
    checkpoint = resolve_adapter(adapter) if adapter else None
    lora = read_adapter_config(checkpoint) if checkpoint else {}
    if model is None:
        model = lora.get("model", OFFLINE_DEFAULT)
    elif lora.get("model") not in (None, model):
        print(f"[eval] warning: the adapter was trained on {lora['model']!r}, evaluating it on {model!r}",
              file=sys.stderr)
    layout = {"lora_targets": lora["targets"], "lora_rank": lora["rank"], "lora_alpha": lora["alpha"]} if lora else {}
    policy, tokenizer = load_policy(model_source(model), name=model, device=device, dtype=dtype, **layout)
    if checkpoint:
        load_adapter(policy, checkpoint)
        print(f"[eval] adapter {checkpoint}", file=sys.stderr)
    return policy, tokenizer, model, checkpoint


def summary_line(label: str, name: str, m: dict, n: int, n_samples: int) -> str:
    line = f"[eval] {label} {name:<8} {m['value']:.3f} +- {m['stderr']:.3f}"
    if name == "em":
        return line + f" ({m['n_correct']}/{n} greedy; {m['n_unparsed']} unparsed, {m['n_truncated']} truncated)"
    if name.startswith("maj@"):
        return line + f" ({m['n_correct']}/{n}; vote of the first {m['k']} of {n_samples} samples; " \
                      f"{m['n_no_vote']} with no parsed answer)"
    return line + f" (mean over {n} problems of the unbiased estimate from {n_samples} samples each)"


def faithful_line(label: str, kind: str, r: dict, n: int, n_samples: int) -> str:
    """The printed faithful accuracy of the greedy answers or of the samples (arith)."""
    line = (f"[eval] {label} faithful accuracy ({kind}) {r['faithful_accuracy']:.3f} "
            f"+- {r['faithful_accuracy_stderr']:.3f}")
    if kind == "greedy":
        return line + f" ({r['faithful']}/{n} problems with a correct answer and faithful reasoning)"
    return line + f" (mean over {n} problems of the share of their {n_samples} samples correct and faithful)"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default=None,
                        help=f"hub id, local directory, or {OFFLINE_DEFAULT} (the offline default); "
                             f"None: the model the adapter was trained on, else {OFFLINE_DEFAULT}")
    parser.add_argument("--adapter", default=None, help="a checkpoint directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--dataset", default="gsm8k", choices=reward.TASKS, help="task name")
    parser.add_argument("--split", default="test", help="data split")
    parser.add_argument("--data-source", default="auto", choices=["auto", "hub", "local"], help="where to load data from")
    parser.add_argument("--arith-digits", type=int, default=tasks.ARITH_DIGITS, help="--dataset arith: digits per number")
    parser.add_argument("--arith-terms", type=int, default=tasks.ARITH_TERMS, help="--dataset arith: numbers per problem")
    parser.add_argument("--metrics", default="em", help="comma-separated: em (greedy), maj@K, pass@K (sampled)")
    parser.add_argument("--limit", type=int, default=50, help="evaluate the first K problems (0 = all)")
    parser.add_argument("--samples", type=int, default=None,
                        help="sampled responses per problem for maj@K / pass@K (None: the largest K)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (maj@K / pass@K)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="generation length limit")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per generate() call")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled responses")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    parser.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                        help="base weights: auto (bf16 on a GPU, fp32 on the CPU), fp32 or bf16")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm progress bars")
    parser.add_argument("--out", default="eval.json", help="where to write the results")
    args = parser.parse_args(argv)
    try:
        metrics = parse_metrics(args.metrics)
    except ValueError as err:
        parser.error(f"--metrics: {err}")
    ks = [k for name, k in metrics if name in SAMPLED]
    if args.limit < 0:
        parser.error(f"--limit must be >= 0 (0 = all problems), got {args.limit}")
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    if ks and args.samples is not None and args.samples < max(ks):
        parser.error(f"--samples {args.samples}: --metrics {args.metrics} needs at least {max(ks)} samples "
                     "per problem (every k of maj@k / pass@k must be <= --samples)")
    if not ks and args.samples is not None:
        print("[eval] note: --samples is unused without maj@K or pass@K in --metrics", file=sys.stderr)
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--batch-size", args.batch_size)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if args.temperature <= 0:
        parser.error(f"--temperature must be > 0 (em is the greedy metric), got {args.temperature}")

    task = tasks.load_task(args.dataset, args.split, args.data_source, arith_digits=args.arith_digits,
                            arith_terms=args.arith_terms)   # first: a data error fails fast
    policy, tokenizer, model, checkpoint = load_for_eval(args.model, args.adapter, args.device, args.dtype)
    examples = task.examples[:args.limit] if args.limit else task.examples
    print(f"[eval] {len(examples)} problems from {task.source}", file=sys.stderr)
    t0 = time.time()
    result = evaluate(policy, tokenizer, examples, args.dataset, metrics=metrics, samples=args.samples,
                      temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens,
                      batch_size=args.batch_size, progress=args.progress)
    seconds = time.time() - t0
    config = vars(args) | {"model": model, "adapter_checkpoint": str(checkpoint) if checkpoint else None,
                           "samples": result["n_samples"]}
    out = {"config": config, "data_source": task.source, "seconds": seconds} | result
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{args.out}.tmp")          # written whole, then renamed: never a half-written file
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(args.out)
    label = f"{args.dataset}/{args.split}"
    for name, m in result["metrics"].items():
        print(summary_line(label, name, m, result["n"], result["n_samples"]))
    for kind, r in result.get("reasoning", {}).items():
        print(faithful_line(label, kind, r, result["n"], result["n_samples"]))
        if r["unfaithful_of_correct"] is not None:
            print(f"[eval] {label} unfaithful share of the correct {kind} answers: {r['unfaithful_of_correct']:.3f} "
                  f"+- {r['unfaithful_of_correct_stderr']:.3f} ({r['unfaithful']}/{r['n_correct']}; "
                  f"faithful {r['faithful']}, wrong {r['wrong']})")
    print(f"[eval] {result['n']} problems in {seconds:.0f}s -> {args.out}")
    return out


if __name__ == "__main__":
    main()
