"""How much the lenient reasoning checker moves the tiny world's faithfulness numbers.

    HF_HUB_OFFLINE=1 python bench/checker_shift.py

reasoning.label used to ask for the reference chain exactly: the problem's terms in their
order, each step's operands as the problem wrote them, "#### N" as the last line. It now
accepts any valid chain (other orders, commuted '+' steps, any spacing, no final line or a final
line the reward reads as the last result; reasoning.py's docstring). This labels the start model
of the tiny world (shipped, before any training) with both checkers on the 500 arith test
problems of configs/tiny.toml: greedy answers as accuracy.run_eval decodes them (max_new_tokens
40, 128 prompts a batch), and 8 samples at temperature 0.5 (seed 0) for the first 200 problems.
It prints, per checker, the label counts, the unfaithful share of the correct answers and the
faithful accuracy, then how many responses changed label, which way, and a few of them.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks import arith_steps, generate_arith  # noqa: E402
from accuracy import evaluate  # noqa: E402
from evaluate import load_for_eval  # noqa: E402
from reasoning import label  # noqa: E402
from reward import extract_answer, is_correct  # noqa: E402

MAX_NEW_TOKENS = 40      # configs/tiny.toml: eval_max_new_tokens (greedy) and max_new_tokens (samples)
BATCH_SIZE = 128         # configs/tiny.toml: gen_batch_size
SAMPLED_PROBLEMS = 200
SAMPLES = 8
TEMPERATURE = 0.5        # configs/tiny.toml: the training temperature
EXAMPLES_SHOWN = 3

# The previous checker (reasoning.py before the lenient definition), kept here verbatim in its
# logic so that the comparison does not depend on which version git has committed.
_STRICT_STEP = re.compile(r"^(\d+) ([+-]) (\d+) = (\d+)\.?$")
_STRICT_FINAL = re.compile(r"^####\s*(\d+)$")


def _strict_chain(response: str, steps: list[tuple[int, str, int, int]]) -> bool:
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    if len(lines) != len(steps) + 1:
        return False
    stated = steps[0][0]
    for line, (_, sign, number, _) in zip(lines, steps):
        match = _STRICT_STEP.match(line)
        if match is None:
            return False
        left, line_sign, right, result = int(match[1]), match[2], int(match[3]), int(match[4])
        if left != stated or line_sign != sign or right != number:
            return False
        if result != (left + right if sign == "+" else left - right):
            return False
        stated = result
    final = _STRICT_FINAL.match(lines[-1])
    return final is not None and int(final[1]) == stated


def strict_label(response: str, solution: str, gold: str) -> str:
    """The previous checker: faithful only for the reference chain, in the problem's order."""
    if not is_correct(extract_answer(response, "arith"), gold, "arith"):
        return "wrong"
    return "faithful" if _strict_chain(response, arith_steps(solution)) else "unfaithful"


def summary_rows(old: list[str], new: list[str]) -> list[str]:
    """Per checker: label counts, unfaithful share of the correct, faithful accuracy (the
    faithful share of all responses: correct and faithful; every sampled problem has the same
    number of samples, so this equals evaluate's mean over problems)."""
    rows = [f"  {'checker':<9}{'faithful':>9}{'unfaithful':>11}{'wrong':>7}{'unf/correct':>13}{'faithful acc':>14}"]
    for name, labels in (("old", old), ("new", new)):
        counts = Counter(labels)
        correct = counts["faithful"] + counts["unfaithful"]
        share = f"{counts['unfaithful'] / correct:.3f}" if correct else "-"
        rows.append(f"  {name:<9}{counts['faithful']:>9}{counts['unfaithful']:>11}{counts['wrong']:>7}"
                    f"{share:>13}{counts['faithful'] / len(labels):>14.3f}")
    return rows


def change_rows(records: list[tuple[str, str, str, str]]) -> list[str]:
    """How many responses changed label, each direction counted, and the first few changed."""
    changed = [r for r in records if r[1] != r[2]]
    directions = Counter((old, new) for _, old, new, _ in changed)
    rows = [f"  changed label: {len(changed)} of {len(records)}"]
    rows += [f"    {old} -> {new}: {n}" for (old, new), n in directions.most_common()]
    for response, old, new, solution in changed[:EXAMPLES_SHOWN]:
        rows.append(f"    example ({old} -> {new}); reference {solution!r}")
        rows.append(f"      response {response!r}")
    return rows


def labelled(predictions: list[dict], examples, kind: str) -> list[tuple[str, str, str, str]]:
    """(response, old label, new label, reference solution) for every greedy response or sample."""
    records = []
    for p, e in zip(predictions, examples):
        for r in ([p] if kind == "greedy" else p["samples"]):
            records.append((r["response"], strict_label(r["response"], e.solution, e.gold),
                            label(r["response"], e.solution, e.gold), e.solution))
    return records


def main() -> None:
    torch.set_num_threads(1)
    policy, tokenizer, _, _ = load_for_eval("tiny-arith", None, "cpu", "fp32")
    examples = generate_arith("test", terms=3)
    greedy = evaluate(policy, tokenizer, examples, "arith", max_new_tokens=MAX_NEW_TOKENS,
                      batch_size=BATCH_SIZE, progress=False)
    sampled = evaluate(policy, tokenizer, examples[:SAMPLED_PROBLEMS], "arith", metrics=f"pass@{SAMPLES}",
                       temperature=TEMPERATURE, seed=0, max_new_tokens=MAX_NEW_TOKENS,
                       batch_size=BATCH_SIZE, progress=False)
    for kind, title, result, shown in (
            ("greedy", f"greedy, {len(examples)} problems", greedy, examples),
            ("samples", f"samples, {SAMPLES} per problem at T={TEMPERATURE}, seed 0, first {SAMPLED_PROBLEMS} "
                        f"problems ({SAMPLES * SAMPLED_PROBLEMS} responses)", sampled, examples[:SAMPLED_PROBLEMS])):
        records = labelled(result["predictions"], shown, kind)
        print(f"{title}:")
        print("\n".join(summary_rows([r[1] for r in records], [r[2] for r in records])))
        print("\n".join(change_rows(records)))
        print()


if __name__ == "__main__":
    main()
