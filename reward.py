"""Tasks: loading a data set, the prompt, answer extraction, correctness and the reward.

The task reward of I-PPO (arXiv 2604.01597) is exact match on the final answer: 1 for a
correct answer, 0 otherwise, with an optional penalty for a response cut off before EOS.
Model text is parsed with regular expressions, Decimal and math-verify's LaTeX parser; it is
never evaluated as Python (no eval/exec, and not sympy's parse_expr, which calls eval). A
MATH-style check is bounded three ways: input caps (MAX_ANSWER_CHARS, MAX_NESTING_DEPTH), a
syntactic guard against huge integers (_too_costly), and a wall-clock limit
(MATH_VERIFY_TIMEOUT_S, in any thread); a check that hits one counts as a wrong answer.

Tasks (`--dataset NAME`; data/README.md gives rows, sources and licences):
    gsm8k          grade-school word problems; answer "#### <number>"; train + test, shipped
                   in data/gsm8k, hub openai/gsm8k.
    math500        MATH-500 (competition math); answer in \\boxed{}; test only, shipped in
                   data/math500, hub HuggingFaceH4/MATH-500.
    college_math   CollegeMath; answer in \\boxed{}; test only, shipped in data/college_math.
    olympiadbench  OlympiadBench (English, text-only math); answer in \\boxed{}; test only,
                   shipped in data/olympiadbench.
    ecqa           ECQA (CommonsenseQA with explanations), five options A-E; answer
                   "Answer: <letter>"; train + test on the hub only (tasksource/ecqa),
                   no offline copy.
    arith          generated addition and subtraction word problems (seeded, in memory, no
                   file); answer "#### <number>"; train + test, never overlapping; difficulty
                   set by digits per number and numbers per problem (--arith-digits,
                   --arith-terms). Short prompts and answers: for watching a small model
                   learn on a laptop CPU.

Public functions:
    load_task(name, split, source="auto", *, arith_digits=2, arith_terms=2)
                                          -> Task (examples + where they came from)
    generate_arith(split, seed, digits, terms, n) -> list[Example] (the arith generator)
    make_prompt(question, task)           -> the instruction text given to the model
    extract_answer(text, task)            -> answer string, or None
    is_correct(pred, gold, task)          -> bool
    reward_fn(completion, gold, task, truncated=False, truncation_penalty=0.0) -> float

Correctness per task: gsm8k and arith compare normalised numbers; the MATH-style tasks compare LaTeX
answers for mathematical equivalence with math-verify (within MATH_VERIFY_TIMEOUT_S); ecqa
accepts the option letter or the option's text.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import random
import re
import signal
import threading
from collections import deque
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
TASKS = ("gsm8k", "math500", "college_math", "olympiadbench", "ecqa", "arith")
MATH_TASKS = ("math500", "college_math", "olympiadbench")    # answers in \boxed{}, checked by math-verify
HUB_IDS = {"gsm8k": ("openai/gsm8k", "main"),                # (repo, config) for datasets.load_dataset
           "math500": ("HuggingFaceH4/MATH-500", None),
           "ecqa": ("tasksource/ecqa", None)}
HUB_SPLITS = {"gsm8k": ("train", "test"), "math500": ("test",), "ecqa": ("train", "test")}
LOCAL_SPLITS = {"gsm8k": ("train", "test"), "math500": ("test",), "college_math": ("test",),
                "olympiadbench": ("test",), "ecqa": ()}
ECQA_LETTERS = "ABCDE"
ARITH_DIGITS = 2   # arith defaults (--arith-digits, --arith-terms): one 2-digit step, "23 + 45"
ARITH_TERMS = 2


@dataclass
class Example:
    question: str   # the text make_prompt wraps; for ecqa the question followed by "A) ..." to "E) ..."
    solution: str   # reference solution, ending in the answer format the task's prompt asks for
                    # ("#### N", "\boxed{...}", "Answer: B"); used for SFT and g_val
    gold: str       # gsm8k: normalised number ("1000"); MATH-style: the LaTeX answer without
                    # enclosing $ ("\frac{\pi}{2}"); several answers are one comma-separated list
                    # ("69,84"), which is how OlympiadBench writes them and which math-verify reads
                    # as a set; ecqa: letter and text of the right option ("B) ignorance")
    where: str      # "file:line" or "hub:openai/gsm8k/train[i]", for error messages


@dataclass
class Task:
    name: str
    split: str
    examples: list[Example]
    source: str     # what was loaded, said in logs and saved in the run directory


def _check_task(name: str) -> None:
    if name not in TASKS:
        raise SystemExit(f"--dataset {name!r}: unknown task; known tasks: {', '.join(TASKS)}")


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def load_task(name: str, split: str, source: str = "auto", *, arith_digits: int = ARITH_DIGITS,
              arith_terms: int = ARITH_TERMS) -> Task:
    """Load a task split. source: "hub", "local" (the files shipped in data/), or "auto" (the
    hub if the task is there, unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set or it cannot
    be reached; else the shipped file). Task.source says which was used, and why.
    arith is generated (source "auto" or "local"); arith_digits and arith_terms set its
    difficulty and are checked whatever the task, so a bad flag is never silently kept."""
    _check_task(name)
    if split not in ("train", "test"):
        raise SystemExit(f"task {name}: unknown split {split!r} (train or test)")
    _check_arith_knobs(arith_digits, arith_terms)
    if name == "arith":
        return _load_arith(split, source, arith_digits, arith_terms)
    if split not in LOCAL_SPLITS[name] and split not in HUB_SPLITS.get(name, ()):
        raise SystemExit(f"--dataset {name}: no {split!r} split is available offline or on the hub; "
                         f"{name} is a test-only benchmark (data/{name}/test.jsonl). Train on gsm8k and "
                         f"evaluate on it: python evaluate.py --dataset {name}")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    on_hub = split in HUB_SPLITS.get(name, ())
    hub_error = None
    if source == "hub" and not on_hub:
        raise SystemExit(f"--data-source hub: task {name} has no {split} split on the hub; use --data-source local")
    if on_hub and (source == "hub" or (source == "auto" and not offline)):
        try:
            return _load_from_hub(name, split)
        except (OSError, ConnectionError, ValueError) as err:  # no network, no such dataset
            if source == "hub":
                raise SystemExit(f"--data-source hub: could not load {HUB_IDS[name][0]}: {err}") from err
            hub_error = str(err).splitlines()[0] if str(err) else type(err).__name__
    if split not in LOCAL_SPLITS[name]:
        if hub_error:
            why = f"it could not be reached ({hub_error})"
        elif offline:
            why = "the hub is off (HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1)"
        else:
            why = "--data-source local was asked"
        raise SystemExit(f"--dataset {name}: no offline copy exists; it loads from the hub ({HUB_IDS[name][0]}) "
                         f"and {why}. Run where the hub is reachable, without HF_HUB_OFFLINE=1.")
    path = DATA_DIR / name / f"{split}.jsonl"
    examples = _read_jsonl(path, _LOCAL_PARSERS[name])
    why = f" (hub not used: {hub_error})" if hub_error else (" (offline)" if source == "auto" and on_hub else "")
    return Task(name, split, examples, f"local file {path.relative_to(DATA_DIR.parent)}{why}")


def _load_from_hub(name: str, split: str) -> Task:
    import datasets

    repo, config = HUB_IDS[name]
    rows = datasets.load_dataset(repo, config, split=split)
    parse_row = _HUB_PARSERS[name]
    examples = [parse_row(row, f"hub:{repo}/{split}[{i}]") for i, row in enumerate(rows)]
    return Task(name, split, examples, f"hub {repo} ({config or 'default'}/{split})")


def _read_jsonl(path: Path, parse_row) -> list[Example]:
    if not path.exists():
        raise SystemExit(f"{path}: data file not found")
    examples = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SystemExit(f"{where}: not valid UTF-8 ({err.reason} at byte {err.start})") from err
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise SystemExit(f"{where}: not valid JSON ({err.msg}, column {err.colno})") from err
            examples.append(parse_row(row, where))
    if not examples:
        raise SystemExit(f"{path}: no examples (the file is empty)")
    return examples


def _require_strings(row, where: str, keys: tuple[str, ...]) -> None:
    if not isinstance(row, dict):
        raise SystemExit(f"{where}: expected a JSON object with {', '.join(map(repr, keys))}")
    for key in keys:
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise SystemExit(f"{where}: missing, empty or non-string field {key!r}")


def _parse_gsm8k_row(row, where: str) -> Example:
    if not isinstance(row, dict):
        raise SystemExit(f"{where}: expected a JSON object with 'question' and 'answer'")
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            raise SystemExit(f"{where}: missing or non-string field {key!r}")
    if "####" not in row["answer"]:
        raise SystemExit(f"{where}: the answer has no '#### N' final answer")
    gold = normalize_number(row["answer"].rsplit("####", 1)[1])
    if gold is None:
        raise SystemExit(f"{where}: the final answer after '####' is not a number")
    # GSM8K's calculator annotations "<<48/2=24>>" are tool markup, not prose: dropped.
    solution = re.sub(r"<<[^>]*>>", "", row["answer"]).strip()
    return Example(row["question"].strip(), solution, gold, where)


def _math_example(question: str, solution: str, where: str) -> Example:
    gold = last_boxed(solution)
    if gold is None or not gold.strip():
        raise SystemExit(f"{where}: the solution has no \\boxed{{...}} final answer")
    return Example(question.strip(), solution.strip(), gold.strip(), where)


def _parse_math500_row(row, where: str) -> Example:
    """data/math500 rows: question, answer = the MATH solution, then "The answer is: X"."""
    _require_strings(row, where, ("question", "answer"))
    # Our choice: the appended "The answer is: X" (added by the BiRM copy) is dropped, so the
    # solution is MATH's own text, as on the hub, ending in the \boxed{} the prompt asks for.
    solution = re.sub(r"The answer is:[^\n]*\Z", "", row["answer"].rstrip())
    return _math_example(row["question"], solution, where)


def _parse_math500_hub_row(row, where: str) -> Example:
    """HuggingFaceH4/MATH-500 rows: problem, solution, answer (= last \\boxed of solution)."""
    _require_strings(row, where, ("problem", "solution"))
    return _math_example(row["problem"], row["solution"], where)


def _strip_math_delimiters(answer: str) -> str:
    """'$\\frac{1}{2}$' -> '\\frac{1}{2}'; text with several $...$ spans is kept as it is."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$" and "$" not in answer[1:-1]:
        return answer[1:-1].strip()
    return answer


def _parse_college_math_row(row, where: str) -> Example:
    """data/college_math rows: question, answer (LaTeX, usually in $...$), data_topic, license."""
    _require_strings(row, where, ("question", "answer"))
    gold = _strip_math_delimiters(row["answer"])
    if not gold:
        raise SystemExit(f"{where}: the answer is empty")
    # CollegeMath has no worked solutions: the reference "solution" is the boxed answer alone.
    return Example(row["question"].strip(), f"The final answer is \\boxed{{{gold}}}.", gold, where)


def _parse_olympiadbench_row(row, where: str) -> Example:
    """data/olympiadbench rows: question, solution (list), final_answer (list), unit, ..."""
    _require_strings(row, where, ("question",))
    for key in ("solution", "final_answer"):
        value = row.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise SystemExit(f"{where}: field {key!r} must be a non-empty list of non-empty strings")
    # Entries are written "$69$,$84$" or "1,3,5": dropping every $ leaves one comma-separated
    # list, and several list entries join into the same kind of list (read as a set when checked).
    answers = [a.replace("$", "").strip().rstrip(".").strip() for a in row["final_answer"]]
    if not all(answers):
        raise SystemExit(f"{where}: an entry of 'final_answer' holds nothing but $ signs")
    gold = ",".join(answers)
    # Our choice: the solution ends with the boxed answer, as the prompt asks of the model.
    solution = f"{row['solution'][0].strip()}\n\nThe final answer is \\boxed{{{gold}}}."
    return Example(row["question"].strip(), solution, gold, where)


def _parse_ecqa_row(row, where: str) -> Example:
    """ECQA rows (tasksource/ecqa, the columns of github.com/dair-iitd/ECQA-Dataset): q_text,
    q_op1..q_op5, q_ans (the text of the right option), taskB (free-flow explanation)."""
    options_keys = tuple(f"q_op{i}" for i in range(1, 6))
    _require_strings(row, where, ("q_text", "q_ans") + options_keys)
    options = [row[k].strip() for k in options_keys]
    answer = row["q_ans"].strip()
    if answer not in options:
        raise SystemExit(f"{where}: the answer {answer!r} is none of the five options")
    letter = ECQA_LETTERS[options.index(answer)]
    question = row["q_text"].strip() + "\n" + "\n".join(f"{L}) {o}" for L, o in zip(ECQA_LETTERS, options))
    explanation = row.get("taskB") if isinstance(row.get("taskB"), str) else ""
    solution = f"{explanation.strip()}\nAnswer: {letter}".strip()
    return Example(question, solution, f"{letter}) {answer}", where)


_LOCAL_PARSERS = {"gsm8k": _parse_gsm8k_row, "math500": _parse_math500_row,
                  "college_math": _parse_college_math_row, "olympiadbench": _parse_olympiadbench_row}
_HUB_PARSERS = {"gsm8k": _parse_gsm8k_row, "math500": _parse_math500_hub_row, "ecqa": _parse_ecqa_row}


# ---------------------------------------------------------------------------------------------
# arith: generated addition and subtraction word problems
# ---------------------------------------------------------------------------------------------
#
# A problem is a start number and terms-1 steps, each adding or taking away a number; every
# number has exactly `digits` digits and the running total never goes below 0 (nobody gives
# away more apples than they have). Its key is the arithmetic alone, "23+45-12": the story it
# is told in (template, name, item) does not count, so two rows with the same key are the same
# problem in other words.
#
# Splits never overlap, by construction: a key belongs to the test split when a hash of it
# (sha256, the same in every process and for every seed) falls in bucket 0 of ARITH_TEST_BUCKETS,
# to the train split otherwise; each split is drawn from its own seeded stream and keeps only
# keys of its own, each once. So the train rows are pairwise distinct, the validation rows
# train.py takes from the end of the train split are none of the rows it trains on, and no test
# problem is in any train split, whatever the seeds.

ARITH_SEED = 0                                    # the data, like a shipped file, is the same for every --seed
ARITH_SIZES = {"train": 5000, "test": 500}        # rows per split (fewer if the difficulty has fewer problems)
ARITH_TEST_BUCKETS = 10                           # one key in ten belongs to the test split
ARITH_MAX_DIGITS = 12
ARITH_MAX_TERMS = 8

# Stories: (opening, items, additions, subtractions, question). The opening holds the start
# number; each step is "verb phrase {n}", so the word before a number says whether it adds or
# takes away.
_ARITH_STORIES = (
    ("{name} has {n} {item} and", ("apples", "marbles", "stickers", "stamps", "shells", "pencils", "cards"),
     ("buys {n} more", "finds {n} more", "is given {n} more"), ("gives away {n}", "loses {n}", "sells {n}"),
     "How many {item} does {name} have now?"),
    ("A jar holds {n} {item}. {name}", ("marbles", "cookies", "buttons", "coins", "candies"),
     ("puts in {n} more", "adds {n} more"), ("takes out {n}", "removes {n}"),
     "How many {item} are in the jar now?"),
    ("A bus leaves the station with {n} {item}. On its way it", ("passengers",),
     ("picks up {n} more",), ("drops off {n}",), "How many {item} are on the bus now?"),
    ("{name} has {n} {item} and", ("dollars",), ("earns {n} more", "is paid {n} more"), ("spends {n}", "loses {n}"),
     "How many {item} does {name} have now?"),
    ("A library shelf holds {n} {item}. The librarian", ("books",), ("puts back {n} more", "adds {n} more"),
     ("lends out {n}", "removes {n}"), "How many {item} are on the shelf now?"),
)
_ARITH_NAMES = ("Tom", "Ana", "Ravi", "Mia", "Lena", "Omar", "Kenji", "Sara", "Paul", "Zoe")


def _check_arith_knobs(digits: int, terms: int) -> None:
    """Refuse a difficulty outside what the generator makes, naming the flag."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= ARITH_MAX_DIGITS:
        raise SystemExit(f"--arith-digits {digits!r}: digits per number must be an integer from 1 to {ARITH_MAX_DIGITS}")
    if isinstance(terms, bool) or not isinstance(terms, int) or not 2 <= terms <= ARITH_MAX_TERMS:
        raise SystemExit(f"--arith-terms {terms!r}: numbers per problem must be an integer from 2 to "
                         f"{ARITH_MAX_TERMS} (2: one addition or subtraction)")


def _stable_int(text: str) -> int:
    """An integer from `text` that is the same in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _arith_key(numbers: list[int], signs: list[str]) -> str:
    """'23+45-12': the problem without its story."""
    return str(numbers[0]) + "".join(f"{sign}{n}" for sign, n in zip(signs, numbers[1:]))


def _arith_split(key: str) -> str:
    """The split a problem belongs to, from its key alone."""
    return "test" if _stable_int("arith-split:" + key) % ARITH_TEST_BUCKETS == 0 else "train"


def _draw_arith(rng: random.Random, digits: int, terms: int) -> tuple[list[int], list[str]]:
    """A start number and terms-1 signed steps, each number with exactly `digits` digits. A step
    is a subtraction with probability 1/2 when the total allows one, else an addition."""
    lo, hi = (1 if digits == 1 else 10 ** (digits - 1)), 10 ** digits - 1
    numbers, signs = [rng.randint(lo, hi)], []
    total = numbers[0]
    for _ in range(terms - 1):
        if rng.random() < 0.5 and total >= lo:
            n = rng.randint(lo, min(hi, total))
            signs.append("-")
            total -= n
        else:
            n = rng.randint(lo, hi)
            signs.append("+")
            total += n
        numbers.append(n)
    return numbers, signs


def _arith_example(rng: random.Random, numbers: list[int], signs: list[str], where: str) -> Example:
    """The problem told as a story, and its step-by-step solution ending in '#### N'."""
    opening, items, additions, subtractions, question = rng.choice(_ARITH_STORIES)
    name, item = rng.choice(_ARITH_NAMES), rng.choice(items)
    steps = [rng.choice(additions if sign == "+" else subtractions).format(n=n)
             for sign, n in zip(signs, numbers[1:])]
    text = (f"{opening.format(name=name, n=numbers[0], item=item)} {', then '.join(steps)}. "
            f"{question.format(name=name, item=item)}")
    lines, total = [], numbers[0]
    for sign, n in zip(signs, numbers[1:]):
        after = total + n if sign == "+" else total - n
        lines.append(f"{total} {sign} {n} = {after}.")
        total = after
    return Example(text, "\n".join(lines) + f"\n#### {total}", str(total), where)


def generate_arith(split: str, seed: int = ARITH_SEED, digits: int = ARITH_DIGITS, terms: int = ARITH_TERMS,
                   n: int | None = None) -> list[Example]:
    """Up to n (default ARITH_SIZES[split]) distinct problems of `split`, the same for the same
    arguments. Draws stop after 20 n + 10000 tries: a small difficulty (1 digit, 2 terms: 126
    problems in all) gives fewer rows."""
    if split not in ARITH_SIZES:
        raise SystemExit(f"task arith: unknown split {split!r} (train or test)")
    _check_arith_knobs(digits, terms)
    n = ARITH_SIZES[split] if n is None else n
    label = f"arith(seed={seed},digits={digits},terms={terms})"
    rng = random.Random(_stable_int(f"{label}/{split}"))   # one stream per split
    examples, seen = [], set()
    for _ in range(20 * n + 10000):
        if len(examples) == n:
            break
        numbers, signs = _draw_arith(rng, digits, terms)
        key = _arith_key(numbers, signs)
        if key in seen or _arith_split(key) != split:
            continue
        seen.add(key)
        examples.append(_arith_example(rng, numbers, signs, f"generated:{label}/{split}[{len(examples)}]"))
    return examples


def _load_arith(split: str, source: str, digits: int, terms: int) -> Task:
    if source == "hub":
        raise SystemExit("--data-source hub: task arith is generated, not loaded; use --data-source auto or local")
    examples = generate_arith(split, ARITH_SEED, digits, terms)
    if not examples:
        raise SystemExit(f"--dataset arith: no {split} problems at --arith-digits {digits} --arith-terms {terms}; "
                         "raise either for more")
    wanted = ARITH_SIZES[split]
    short = "" if len(examples) == wanted else f" (only {len(examples)} of {wanted}: few problems at this difficulty)"
    return Task("arith", split, examples,
                f"generated: arith(seed={ARITH_SEED}, digits={digits}, terms={terms}), {len(examples)} rows{short}")


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

def make_prompt(question: str, task: str = "gsm8k") -> str:
    """The instruction the model sees (inside the chat template when the tokenizer has one)."""
    _check_task(task)
    if task in MATH_TASKS:
        return ("Solve the math problem. Reason step by step, then give the final answer "
                "in \\boxed{}.\n\n"
                f"Question: {question}\nAnswer:")
    if task == "ecqa":
        return ("Answer the multiple-choice question. Reason briefly, then give the letter of the "
                "correct option on its own line as 'Answer: <letter>'.\n\n"
                f"Question: {question}\nAnswer:")
    if task == "arith":
        # Our choice: no instruction. The tiny world's character-level model is trained from
        # scratch on this prompt, and an instruction line would double its tokens (and its
        # compute); other models learn the '#### N' format from SFT on the reference solutions.
        return f"Question: {question}\nAnswer:"
    return ("Solve the math problem. Reason step by step, then give the final answer "
            "on its own line as '#### <number>'.\n\n"
            f"Question: {question}\nAnswer:")


# ---------------------------------------------------------------------------------------------
# GSM8K: numbers
# ---------------------------------------------------------------------------------------------

# A number as people write it: optional sign, digits with or without thousands commas,
# optional decimals. "1,2,3" is three numbers; "5." is the number 5 ending a sentence.
_NUMBER = re.compile(r"-?(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?(?:\$\s?)?\.\d+")
_FINAL = re.compile(r"####\s*([^\n]*)")
MAX_NUMBER_CHARS = 100  # longer digit strings are not answers; refusing them bounds the work


def normalize_number(text: str) -> str | None:
    """'$1,000.00' -> '1000', '-3.50' -> '-3.5', '-0' -> '0'; None if `text` holds no number.
    The first number in `text` is taken."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    digits = match.group(0).replace("$", "").replace(",", "").replace(" ", "")
    if len(digits) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Decimal(digits)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _extract_gsm8k(text: str) -> str | None:
    finals = _FINAL.findall(text)
    if finals:
        answer = normalize_number(finals[-1])
        if answer is not None:
            return answer
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


# ---------------------------------------------------------------------------------------------
# MATH-style answers: \boxed{...}
# ---------------------------------------------------------------------------------------------

# Bounds on checking one MATH-style answer (our choices; an answer past one counts as wrong):
MATH_VERIFY_TIMEOUT_S = 2.0  # wall-clock limit for one comparison (parse both, then verify)
MAX_ANSWER_CHARS = 1000      # longer answers are not checked; the longest gold has 993 chars
MAX_NESTING_DEPTH = 8        # deeper ( [ { nesting is not checked: the LaTeX parser needs about
                             # 1 s at 10 levels, minutes at 100; the deepest gold has 5
MAX_EXPONENT_DIGITS = 4      # 2^{12345} is not checked: sympy would build a huge integer
MAX_BOXED_TRIES = 8          # \boxed occurrences looked at, from the last one back
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"answer is:?\s*([^\n]{1,%d})" % MAX_ANSWER_CHARS, re.IGNORECASE)


def _braced(text: str, open_at: int) -> str | None:
    """Content of the {...} group whose '{' is at text[open_at], nested braces included (a
    backslash-escaped brace does not count); None if it is not closed within MAX_ANSWER_CHARS."""
    depth = 0
    i = open_at
    end = min(len(text), open_at + MAX_ANSWER_CHARS + 2)
    while i < end:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last closed \\boxed{...} (or \\fbox{...}) in `text`, nested braces kept.
    An unclosed last one (a cut-off response) gives way to the one before it."""
    last = deque(_BOXED.finditer(text), maxlen=MAX_BOXED_TRIES)  # one linear pass, however long
    for match in reversed(last):
        content = _braced(text, match.end() - 1)
        if content is not None:
            return content
    return None


def _extract_math(text: str) -> str | None:
    """The last \\boxed{...}; else what follows the last "answer is" (the format the MATH-500
    rows end with), up to the end of its line, without $ and a final period; else None.
    Our choice: no fallback to the last $...$ formula, which is often an intermediate step."""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    phrases = _ANSWER_IS.findall(text)
    if phrases:
        answer = phrases[-1].strip().rstrip(".").strip().strip("$").strip()
        return answer or None
    return None


# ---------------------------------------------------------------------------------------------
# ECQA: an option letter or an option's text
# ---------------------------------------------------------------------------------------------

_CHOICE_PHRASE = re.compile(r"answer\s*(?:is|:)\s*([^\n]{1,200})", re.IGNORECASE)
_LETTER_ONLY = re.compile(r"\W*(?:option\s+)?\(?([A-E])\)?\W*")       # "B", "(B)", "**B**.", "option B"
_LETTER_FIRST = re.compile(r"\W*\(?([A-E])[).:]\s")                      # "B) ignorance", "(B) ...", "B. ..."


def _normalize_text(text: str) -> str:
    """Lower case, single spaces, no punctuation: for comparing option texts."""
    return " ".join(re.sub(r"[^\w\s'-]", " ", text.lower()).split())


def _letter(phrase: str) -> str | None:
    """The option letter if `phrase` is a letter alone or a letter leading the option text."""
    match = _LETTER_ONLY.fullmatch(phrase) or _LETTER_FIRST.match(phrase)
    return match.group(1) if match else None


def _extract_choice(text: str) -> str | None:
    """ECQA answer: what follows the last "Answer:" / "answer is", else the last \\boxed{},
    else a first or last line that is only a letter ("B", "(B)", "B) ignorance"). A letter
    comes back upper case; anything else as option text, normalised; None if nothing."""
    phrases = _CHOICE_PHRASE.findall(text)
    boxed = last_boxed(text)
    phrase = phrases[-1] if phrases else boxed
    if phrase is not None:
        inner = last_boxed(phrase)
        phrase = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", inner if inner is not None else phrase).strip()
        return _letter(phrase) or _normalize_text(phrase) or None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines[:1] + lines[-1:]:
        if len(line) <= 200 and _letter(line):
            return _letter(line)
    return None


def extract_answer(text: str, task: str = "gsm8k") -> str | None:
    """The final answer of a completion, or None if there is none.
    gsm8k, arith: the number after the last '####', else the last number anywhere; normalised.
    MATH-style: the last \\boxed{...}, else the text after the last "answer is".
    ecqa: the option letter (or the option text) after the last "Answer:"."""
    _check_task(task)
    if task in MATH_TASKS:
        return _extract_math(text)
    if task == "ecqa":
        return _extract_choice(text)
    return _extract_gsm8k(text)


# ---------------------------------------------------------------------------------------------
# Checking MATH-style answers: string match, then math-verify under a time limit
# ---------------------------------------------------------------------------------------------

class _CheckTimeout(BaseException):
    """Raised inside a check that ran out of time. A BaseException, so that the `except
    Exception` clauses inside math-verify and sympy do not swallow it."""


def _run_with_alarm(fn, seconds: float):
    """Main thread: SIGALRM after `seconds`, then every 0.1 s in case sympy swallows one in a
    finaliser. A signal also stops CPython's long-integer arithmetic, which checks for signals."""
    armed = True

    def on_alarm(signum, frame):
        if armed:
            raise _CheckTimeout

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.1)
    try:
        return fn()
    finally:
        armed = False  # first: from here on an alarm does nothing, so nothing below is cut short
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)


def _run_with_watchdog(fn, seconds: float):
    """Any other thread: a watchdog thread raises _CheckTimeout in this one through CPython's
    PyThreadState_SetAsyncExc (it lands between two bytecodes, as a signal does), again every
    0.1 s. It cannot stop one long C call, a huge integer power: _too_costly refuses those."""
    if not hasattr(ctypes, "pythonapi"):  # not CPython: no way to interrupt, run unbounded
        return fn()
    send = ctypes.pythonapi.PyThreadState_SetAsyncExc
    target = ctypes.c_ulong(threading.get_ident())
    lock, done = threading.Lock(), threading.Event()

    def watchdog():
        delay = seconds
        while not done.wait(delay):
            with lock:
                if not done.is_set():
                    send(target, ctypes.py_object(_CheckTimeout))
            delay = 0.1

    threading.Thread(target=watchdog, name="reward-check-watchdog", daemon=True).start()
    try:
        return fn()
    finally:
        while True:  # retried: a _CheckTimeout sent just now may land inside this block
            try:
                with lock:
                    done.set()          # the watchdog sends nothing more ...
                    send(target, None)  # ... and one sent but not yet raised is dropped
                break
            except _CheckTimeout:
                continue


def _run_with_time_limit(fn, seconds: float):
    """fn(), stopped by _CheckTimeout once `seconds` have passed, in any thread. Our choice
    over math-verify's own timers, which are SIGALRM alarms that raise ValueError outside the
    main thread: an alarm in the main thread (unless someone else's SIGALRM timer is running,
    which is left alone), a watchdog thread everywhere else."""
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer") and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
        return _run_with_alarm(fn, seconds)
    return _run_with_watchdog(fn, seconds)


def _nesting_depth(text: str) -> int:
    """How deep ( [ { groups nest in `text`, all three kinds counted together."""
    depth = deepest = 0
    for c in text:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    return deepest


def _group_after(text: str, open_at: int) -> str:
    """The bracketed group opening at text[open_at], ( [ { counted together; the rest of the
    text if it never closes."""
    depth = 0
    for i in range(open_at, min(len(text), open_at + MAX_ANSWER_CHARS)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            return text[open_at:i + 1]
    return text[open_at:open_at + MAX_ANSWER_CHARS]


def _exponents(text: str):
    """The exponents in `text`: each '^{...}' or '^(...)' group, or the token after a bare '^'
    (with the next '^' if the powers chain: '9^9^9')."""
    for match in re.finditer(r"\^\s*", text):
        start = match.end()
        if start < len(text) and text[start] in "{(":
            yield _group_after(text, start)
        else:
            yield re.match(r"[\w.]*\s*\^?", text[start:start + 100]).group(0)


_BIG_INTEGER = re.compile(r"(?<![\d.])\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))  # 12345, not 0.12345


def _operand_before(text: str, end: int) -> str:
    """The operand ending just before text[end]: a (...) or {...} group, or a word/number."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    if i > 0 and text[i - 1] in ")}":
        depth = 0
        for j in range(i - 1, max(-1, i - 1 - MAX_ANSWER_CHARS), -1):
            depth += text[j] in ")}"
            depth -= text[j] in "({"
            if depth == 0:
                return text[j:i]
        return text[:i]
    match = re.search(r"[\w.!]*\Z", text[max(0, i - 100):i])
    return match.group(0)


def _has_numeric_power(text: str) -> bool:
    """Does `text` raise a number to a power (10^{3}, (2+3)^4, {10}^x), not a variable (x^2)?"""
    for match in re.finditer(r"\^", text):
        base = _operand_before(text, match.start())
        if re.search(r"\d", base) and not re.search(r"[A-Za-z]", base):
            return True
    return False


def _too_costly(answer: str) -> bool:
    """True when sympy could try to build an enormous integer from `answer`: a power tower on a
    number (10^{10^{10}}, 9^9^9), an exponent with more than MAX_EXPONENT_DIGITS digits
    (2^{123456}, \\prod_{k=1}^{10000000}), or a factorial or binomial of such things
    ((10^{10})!, 123456!, \\binom{10^{10}}{5}). A syntactic guard, cheap and conservative, for
    what no timer can interrupt: one long C-level integer operation."""
    for exponent in _exponents(answer):
        if _has_numeric_power(exponent) or exponent.rstrip().endswith("^") or "!" in exponent:
            return True
        if _BIG_INTEGER.search(exponent):
            return True
    operands = [_operand_before(answer, m.start()) for m in re.finditer("!", answer)]
    if re.search(r"\\[dt]?binom|\\choose", answer):
        operands.append(answer)  # a binomial's arguments: the whole answer, to keep this simple
    return any(_has_numeric_power(x) or _BIG_INTEGER.search(x) or "!" in x for x in operands)


def _plain_form(answer: str) -> str:
    """A spelling-insensitive form for a first, cheap string comparison: no $ or \\$, spaces,
    \\left/\\right, \\! \\, \\; spacing, final period; \\dfrac and \\tfrac become \\frac;
    \\text{..}, \\mathrm{..} keep only their content; words-only answers are lower-cased."""
    s = _strip_math_delimiters(answer.replace("\\$", ""))
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|displaystyle)\b|\\[!,;: ]|~", "", s)
    s = re.sub(r"\\[dt]frac\b", r"\\frac", s)
    s = "".join(s.split()).rstrip(".")
    s = re.sub(r"^\(([A-Za-z])\)$", r"\1", s)   # a choice "(C)" is the letter C
    if re.fullmatch(r"[A-Za-z'-]+", s):
        s = s.lower()
    return s


# "No solution", "\\text{Evelyn}", "converges": words of two or more letters, nothing else
# ("p - q" and "x" are algebra). sympy would read a word as a product of letter symbols.
_WORDS_ONLY = re.compile(r"(?:\\text\s*\{)?\s*[A-Za-z]{2,}(?:[ '-]+[A-Za-z]+)*\s*\}?\.?")


def _math_verify_input(answer: str) -> str:
    """math-verify reads LaTeX inside $...$ or \\boxed{}: a currency \\$ is dropped, \\leqslant
    becomes \\leq, and an answer with no $ span is wrapped in \\boxed{}, the form math-verify's
    extraction looks for first."""
    answer = answer.replace("\\$", "")
    answer = re.sub(r"\\([lg]eq)slant\b", r"\\\1", answer)   # CollegeMath writes \leqslant for \leq
    return answer if "$" in answer else f"\\boxed{{{answer}}}"


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's verdict, False if it takes longer than MATH_VERIFY_TIMEOUT_S. Its own
    signal-based timers are off (parsing_timeout=None, timeout_seconds=None): they raise
    ValueError in a worker thread, and _run_with_time_limit bounds parse and verify together."""
    from math_verify import LatexExtractionConfig, parse, verify  # here: gsm8k runs skip sympy

    # Our choice: LaTeX extraction only. math-verify's plain-expression extraction hands text to
    # sympy's parse_expr, which runs eval(); the LaTeX parser builds sympy objects directly.
    latex_only = [LatexExtractionConfig()]

    # math-verify warns once that its own timers are off: ours replace them.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    def compare() -> bool:
        gold_parsed = parse(_math_verify_input(gold), latex_only, parsing_timeout=None)
        pred_parsed = parse(_math_verify_input(pred), latex_only, parsing_timeout=None)
        return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=None))

    try:
        return _run_with_time_limit(compare, MATH_VERIFY_TIMEOUT_S)
    except _CheckTimeout:
        return False
    except Exception:  # noqa: BLE001 -- sympy can raise almost anything on odd input: not equal
        return False


def _math_equal(pred: str, gold: str) -> bool:
    """Is the MATH-style answer `pred` equivalent to `gold`? Capped inputs, then a string
    comparison, then math-verify (sympy) within MATH_VERIFY_TIMEOUT_S."""
    if len(pred) > MAX_ANSWER_CHARS or _nesting_depth(pred) > MAX_NESTING_DEPTH:
        return False
    if _plain_form(pred) == _plain_form(gold):
        return True
    if _WORDS_ONLY.fullmatch(gold.strip()) or _WORDS_ONLY.fullmatch(pred.strip()):
        return False  # a words answer ("No solution", "converges") matches by its words alone
    if len(gold) > MAX_ANSWER_CHARS or _nesting_depth(gold) > MAX_NESTING_DEPTH:
        return False
    if _too_costly(pred) or _too_costly(gold):
        return False
    return _math_verify_equal(pred, gold)


def _choice_equal(pred: str, gold: str) -> bool:
    letter, _, text = gold.partition(") ")
    return pred == letter or _normalize_text(pred) == _normalize_text(text)


def is_correct(pred: str | None, gold: str, task: str = "gsm8k") -> bool:
    """gsm8k, arith: exact match of normalised numbers ('1000' == '1000.00' after normalisation).
    MATH-style: equivalent LaTeX (\\frac{1}{2} == 0.5 == \\dfrac12, 90^\\circ == 90,
    (3, \\pi/2) == \\left( 3, \\frac{\\pi}{2} \\right); lists compare as sets); answers longer than
    MAX_ANSWER_CHARS or slower than MATH_VERIFY_TIMEOUT_S to check count as wrong.
    ecqa: the right option's letter or text."""
    _check_task(task)
    if pred is None:
        return False
    if task in MATH_TASKS:
        return _math_equal(pred, gold)
    if task == "ecqa":
        return _choice_equal(pred, gold)
    return pred == gold


def reward_fn(completion: str, gold: str, task: str = "gsm8k", truncated: bool = False,
              truncation_penalty: float = 0.0, flip: bool = False) -> float:
    """1.0 for a correct final answer, else 0.0; minus `truncation_penalty` if the response
    hit the token limit before EOS (our choice: a cut-off answer still counts if correct).
    flip: planted reward noise (train.py --reward-noise): a correct answer scores as wrong
    and a wrong one as right; the truncation penalty is not flipped."""
    correct = is_correct(extract_answer(completion, task), gold, task)
    score = 1.0 if correct != flip else 0.0
    return score - (truncation_penalty if truncated else 0.0)
