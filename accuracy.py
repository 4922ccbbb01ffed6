"""Accuracy of a policy on a benchmark: exact match (greedy), maj@k and pass@k (sampled).

Metrics, each over the evaluated problems (the mean over problems is the reported value):
    em       greedy decoding; a problem counts iff answers.is_correct(extracted answer, gold).
    maj@k    majority vote over the extracted answers of the FIRST k of the n sampled
             responses (`majority_vote`); the problem counts iff the voted answer is correct.
    pass@k   the unbiased estimator of Chen et al. 2021 (Codex paper, eq. 1) from all n
             samples, c of them correct: 1 - C(n - c, k) / C(n, k) (`pass_at_k`).
Standard errors: sqrt(p (1 - p) / N) for em and maj@k (N problems, binomial); for pass@k
the standard error of the mean of the per-problem estimates, sqrt(var / N) with the
population variance (so it equals the binomial formula when every estimate is 0 or 1).
On arith the result also has "reasoning" (reasoning.py's labels, counted), with the faithful
accuracy: the share of problems whose answer is correct AND faithful, em x (1 - unfaithful
share of the correct), i.e. accuracy once right answers reached by a wrong step stop counting
(`faithful_accuracy_summary`).

evaluate.py is the command that loads a model (and adapter) and writes these to a file;
train.py measures greedy em during a run with run_eval.

Public functions:
    evaluate(policy, tokenizer, examples, task, ...) -> dict: metrics, counts, per-problem predictions
    run_eval(cfg, policy, tokenizer, examples, dist) -> train.py's greedy em (and faithful accuracy)
                                                        over all torchrun ranks
    parse_metrics("em,maj@8,pass@8")                 -> [("em", None), ("maj", 8), ("pass", 8)]
    pass_at_k(n, c, k)                               -> float
    majority_vote(answers)                           -> the winning answer, or None
    metric_name(("maj", 8))                          -> "maj@8"
    generate_responses(policy, tokenizer, prompts, gen_config, batch_size) -> decoded responses
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from tqdm import tqdm
from transformers import GenerationConfig

import reasoning
import answers
import tasks
from distributed import SINGLE
from model import eos_token_ids
from rollout import encode_prompts, plain_generate

SAMPLED = ("maj", "pass")  # metrics computed from sampled responses; "em" uses the greedy one


def parse_metrics(text: str) -> list[tuple[str, int | None]]:
    """'em,maj@8,pass@8' -> [("em", None), ("maj", 8), ("pass", 8)]. Raises ValueError with
    a message naming the bad item: unknown names, k missing or < 1, repeats."""
    metrics = []
    for item in (part.strip() for part in text.split(",")):
        if item == "em":
            metrics.append(("em", None))
            continue
        name, at, k = item.partition("@")
        if name not in SAMPLED or not at:
            raise ValueError(f"{item!r} is not a metric; use em, maj@K or pass@K (e.g. em,maj@8,pass@8)")
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"{item!r}: K must be a whole number >= 1")
        metrics.append((name, int(k)))
    names = [metric_name(m) for m in metrics]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} asked for more than once")
    return metrics


def metric_name(metric: tuple[str, int | None]) -> str:
    name, k = metric
    return name if k is None else f"{name}@{k}"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n, c of them
    correct, is correct: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, eq. 1). Computed as the
    product 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms the large binomials."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def majority_vote(answers: list[str | None]) -> str | None:
    """The most frequent answer; answers are the normalised strings of answers.extract_answer,
    compared by string equality (our choice: a vote needs an equivalence that is transitive,
    which is_correct's symbolic checks need not be). None (unparsed) never wins; all None
    gives None. Tie rule: among the answers with the top count, the one whose first
    occurrence comes earliest in `answers` wins."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def binomial_stderr(p: float, n: int) -> float:
    """sqrt(p (1 - p) / n): the standard error of a mean of n 0/1 outcomes (0 when n = 0)."""
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def mean_stderr(values: list[float]) -> float:
    """sqrt(var / n) with the population variance (denominator n) of the n values."""
    n = len(values)
    if n == 0:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / n / n)


def score_predictions(predictions: list[dict], metrics: list[tuple[str, int | None]], task: str) -> dict:
    """Metric values from per-problem records. Each record has "gold", and, for em, "pred",
    "correct", "truncated" (the greedy response); for maj@k / pass@k, "samples": a list of
    {"pred", "correct", ...}. Adds per problem "maj@k": {"vote", "correct"} and "pass@k": the
    estimate. Returns {name: {"value", "stderr", ...counts}}; every mean is over problems."""
    N = len(predictions)
    results = {}
    for metric in metrics:
        name, k = metric
        key = metric_name(metric)
        if name == "em":
            n_correct = sum(p["correct"] for p in predictions)
            value = n_correct / N if N else 0.0
            results[key] = {"value": value, "stderr": binomial_stderr(value, N), "n_correct": n_correct,
                            "n_unparsed": sum(p["pred"] is None for p in predictions),
                            "n_truncated": sum(p["truncated"] for p in predictions)}
        elif name == "maj":
            for p in predictions:
                vote = majority_vote([s["pred"] for s in p["samples"][:k]])
                p[key] = {"vote": vote, "correct": answers.is_correct(vote, p["gold"], task)}
            n_correct = sum(p[key]["correct"] for p in predictions)
            value = n_correct / N if N else 0.0
            results[key] = {"value": value, "stderr": binomial_stderr(value, N), "n_correct": n_correct,
                            "n_no_vote": sum(p[key]["vote"] is None for p in predictions), "k": k}
        else:  # pass
            for p in predictions:
                p[key] = pass_at_k(len(p["samples"]), sum(s["correct"] for s in p["samples"]), k)
            estimates = [p[key] for p in predictions]
            results[key] = {"value": sum(estimates) / N if N else 0.0, "stderr": mean_stderr(estimates), "k": k}
    return results


# ----------------------------------------------------------------------------- generation

def generate_responses(policy, tokenizer, prompts: list[str], gen_config: GenerationConfig, *, batch_size: int,
                       progress: bool, desc: str) -> list[tuple[str, bool]]:
    """(response text up to the first EOS, truncated = no EOS within max_new_tokens) per prompt,
    `batch_size` prompts per generate() call."""
    eos = torch.tensor(eos_token_ids(tokenizer))
    out = []
    for s in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch", disable=not progress, leave=False):
        ids, mask = encode_prompts(tokenizer, prompts[s:s + batch_size])
        tokens = plain_generate(policy.lm, ids.to(policy.device), mask.to(policy.device),
                                gen_config)[:, ids.shape[1]:].cpu()                    # (B, <= max_new_tokens)
        for row in tokens:
            is_eos = torch.isin(row, eos)
            end = int(is_eos.long().argmax()) if is_eos.any() else len(row)
            out.append((tokenizer.decode(row[:end], skip_special_tokens=True), not bool(is_eos.any())))
    return out


@torch.no_grad()
def evaluate(policy, tokenizer, examples, task: str, *, metrics="em", samples: int | None = None,
             temperature: float = 1.0, seed: int = 0, max_new_tokens: int = 256, batch_size: int = 16,
             progress: bool = True) -> dict:
    """Evaluate `policy` on `examples` (tasks.Example) of `task`.

    metrics: a string for parse_metrics or its parsed list. em decodes greedily; maj@k and
    pass@k sample `samples` responses per problem (default: the largest k asked; it must be
    >= every k) by pure temperature sampling, inside a forked torch RNG seeded by `seed`, so
    the same (seed, batch_size, policy) gives the same samples and the caller's RNG is
    untouched. batch_size: sequences per generate() call.

    Returns {"n", "n_samples", "metrics": {name: {"value", "stderr", ...}}, "predictions": [per
    problem: question, gold; greedy response, pred, correct, truncated (em); "samples":
    [{response, pred, correct, truncated}] and per-metric fields (maj@k, pass@k)]}, and, when
    em is asked, its "accuracy", "stderr", "n_correct", "n_unparsed", "n_truncated" at the
    top level too (what accuracy.run_eval reads). On arith also "reasoning": {"greedy" (em asked),
    "samples" (samples drawn): the label counts, the unfaithful share of the correct and the
    faithful accuracy, each with its standard error} (reasoning_summary)."""
    metrics = parse_metrics(metrics) if isinstance(metrics, str) else list(metrics)
    ks = [k for name, k in metrics if name in SAMPLED]
    n_samples = (samples if samples is not None else max(ks)) if ks else 0
    if ks and n_samples < max(ks):
        raise ValueError(f"samples={n_samples}: maj@k and pass@k need at least k samples per problem "
                         f"(largest k asked: {max(ks)})")
    predictions = [{"question": e.question, "gold": e.gold} for e in examples]

    if any(name == "em" for name, _ in metrics):
        greedy = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                                  eos_token_id=eos_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)
        responses = generate_responses(policy, tokenizer, [tasks.make_prompt(e.question, task) for e in examples],
                                       greedy, batch_size=batch_size, progress=progress, desc="eval greedy")
        for p, (response, truncated) in zip(predictions, responses):
            pred = answers.extract_answer(response, task)
            p |= {"response": response, "pred": pred, "correct": answers.is_correct(pred, p["gold"], task),
                  "truncated": truncated}

    if n_samples:
        # Same sampling as rollout.generate_rollouts: no top-k / top-p, the model's own
        # generation_config not used.
        sampling = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                    max_new_tokens=max_new_tokens, eos_token_id=eos_token_ids(tokenizer),
                                    pad_token_id=tokenizer.pad_token_id)
        prompts = [tasks.make_prompt(e.question, task) for e in examples for _ in range(n_samples)]  # problem-major
        devices = [policy.device] if policy.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            responses = generate_responses(policy, tokenizer, prompts, sampling, batch_size=batch_size,
                                           progress=progress, desc="eval sampling")
        for i, p in enumerate(predictions):
            p["samples"] = []
            for response, truncated in responses[i * n_samples:(i + 1) * n_samples]:
                pred = answers.extract_answer(response, task)
                p["samples"].append({"response": response, "pred": pred,
                                     "correct": answers.is_correct(pred, p["gold"], task), "truncated": truncated})

    results = score_predictions(predictions, metrics, task)
    out = {"n": len(predictions), "n_samples": n_samples, "metrics": results}
    if task == "arith":
        out["reasoning"] = reasoning_summary(predictions, examples)
    if n_samples:
        out["n_sample_unparsed"] = sum(s["pred"] is None for p in predictions for s in p["samples"])
        out["n_sample_truncated"] = sum(s["truncated"] for p in predictions for s in p["samples"])
    if "em" in results:
        em = results["em"]
        out |= {"accuracy": em["value"], "stderr": em["stderr"], "n_correct": em["n_correct"],
                "n_unparsed": em["n_unparsed"], "n_truncated": em["n_truncated"]}
    out["predictions"] = predictions
    return out


def reasoning_summary(predictions: list[dict], examples) -> dict:
    """arith: label every greedy response and sample (reasoning.label: faithful, unfaithful,
    wrong; stored in its record as "reasoning") and count the labels, for the greedy responses
    and for the samples, with the unfaithful share of the correct ones and its standard error
    (binomial over the correct responses; samples of one problem are not independent, so for
    "samples" it is a lower bound), and the faithful accuracy (faithful_accuracy_summary)."""
    summary = {}
    for kind in ("greedy", "samples"):
        records = ([(p, e) for p, e in zip(predictions, examples) if "response" in p] if kind == "greedy" else
                   [(s, e) for p, e in zip(predictions, examples) for s in p.get("samples", [])])
        if not records:
            continue
        for record, e in records:
            record["reasoning"] = reasoning.label(record["response"], e.solution, e.gold)
        counts = reasoning.label_counts([record["reasoning"] for record, _ in records])
        n_correct = counts["faithful"] + counts["unfaithful"]
        share = counts["unfaithful_of_correct"]
        summary[kind] = counts | {"n_correct": n_correct,
                                  "unfaithful_of_correct_stderr": None if share is None else
                                  binomial_stderr(share, n_correct)} | faithful_accuracy_summary(predictions, kind)
    return summary


def faithful_accuracy_summary(predictions: list[dict], kind: str) -> dict:
    """Faithful accuracy of the labelled records (their "reasoning"): the share of problems
    whose answer is correct AND faithful. Accuracy alone counts a right answer reached by a
    wrong step; this is the part of accuracy that a correct chain of steps earns.

    greedy:  faithful greedy responses / N problems, binomial stderr sqrt(p (1 - p) / N).
    samples: per problem the share of its samples labelled faithful, then the mean over the
             N problems, with the stderr of that mean over problems (mean_stderr): a problem's
             samples are not independent, so they are not counted as N x n outcomes.
    Returns {"faithful_accuracy", "faithful_accuracy_stderr"}."""
    if kind == "greedy":
        outcomes = [float(p["reasoning"] == "faithful") for p in predictions]
        value = sum(outcomes) / len(outcomes)
        return {"faithful_accuracy": value, "faithful_accuracy_stderr": binomial_stderr(value, len(outcomes))}
    shares = [sum(s["reasoning"] == "faithful" for s in p["samples"]) / len(p["samples"]) for p in predictions]
    return {"faithful_accuracy": sum(shares) / len(shares), "faithful_accuracy_stderr": mean_stderr(shares)}


def run_eval(cfg, policy, tokenizer, eval_examples, dist=SINGLE) -> dict:
    """Greedy exact match on eval_examples (under torchrun each rank takes its share and the
    counts are summed); on arith also the unfaithful share of the correct greedy answers
    (reasoning.py)."""
    mine = eval_examples[slice(*dist.span(len(eval_examples)))]
    # correct, n, unparsed, truncated, unfaithful (of the correct)
    counts = torch.zeros(5, dtype=torch.float64, device=policy.device)
    if mine:
        r = evaluate(policy, tokenizer, mine, cfg.dataset, max_new_tokens=cfg.eval_max_new_tokens,
                     batch_size=cfg.gen_batch_size, progress=cfg.progress)
        unfaithful = r["reasoning"]["greedy"]["unfaithful"] if "reasoning" in r else 0
        counts += torch.tensor([r["n_correct"], r["n"], r["n_unparsed"], r["n_truncated"], unfaithful],
                               dtype=torch.float64, device=counts.device)
    n_correct, n, n_unparsed, n_truncated, n_unfaithful = dist.sum(counts).tolist()
    accuracy = n_correct / max(n, 1)
    out = {"eval_accuracy": accuracy, "eval_stderr": math.sqrt(accuracy * (1 - accuracy) / max(n, 1)),
           "eval_n": int(n), "eval_unparsed": int(n_unparsed), "eval_truncated": int(n_truncated)}
    if cfg.dataset == "arith":   # and the share of problems answered right with faithful reasoning
        out["eval_unfaithful_of_correct"] = n_unfaithful / n_correct if n_correct else None
        out["eval_faithful_accuracy"] = (n_correct - n_unfaithful) / max(n, 1)
    return out
