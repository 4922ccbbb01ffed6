"""Tasks: the data sets, the arith generator and the prompt.

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
                   learn on a laptop CPU (and the tiny world's model, tiny_world.py).

A row that cannot be used is refused with its file and line (or hub index). The gold answers
are normalised by the same code that checks the model's answers (reward.py).

Public functions:
    load_task(name, split, source="auto", *, arith_digits=2, arith_terms=2)
                                          -> Task (examples + where they came from)
    generate_arith(split, seed, digits, terms, n) -> list[Example] (the arith generator)
    make_prompt(question, task)           -> the instruction text given to the model
    Example, Task                            one problem (question, reference solution, gold
                                          answer, where it came from); a loaded split
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from reward import MATH_TASKS, check_task, last_boxed, normalize_number, strip_math_delimiters

DATA_DIR = Path(__file__).resolve().parent / "data"
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
    story: int | None = None   # arith: the index of its story in ARITH_STORIES (the tiny world's
                               # shortcut solutions are planted by story); None elsewhere


@dataclass
class Task:
    name: str
    split: str
    examples: list[Example]
    source: str     # what was loaded, said in logs and saved in the run directory


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
    check_task(name)
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


def _parse_college_math_row(row, where: str) -> Example:
    """data/college_math rows: question, answer (LaTeX, usually in $...$), data_topic, license."""
    _require_strings(row, where, ("question", "answer"))
    gold = strip_math_delimiters(row["answer"])
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

# Stories. The opening holds the start number; each step is "verb phrase {n}", so the word
# before a number says whether it adds or takes away.
class Story(NamedTuple):
    opening: str
    items: tuple[str, ...]
    additions: tuple[str, ...]
    subtractions: tuple[str, ...]
    question: str


ARITH_STORIES = tuple(Story(*story) for story in (
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
))
ARITH_NAMES = ("Tom", "Ana", "Ravi", "Mia", "Lena", "Omar", "Kenji", "Sara", "Paul", "Zoe")


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
    story = rng.choice(range(len(ARITH_STORIES)))   # the same draw as rng.choice(ARITH_STORIES)
    opening, items, additions, subtractions, question = ARITH_STORIES[story]
    name, item = rng.choice(ARITH_NAMES), rng.choice(items)
    steps = [rng.choice(additions if sign == "+" else subtractions).format(n=n)
             for sign, n in zip(signs, numbers[1:])]
    text = (f"{opening.format(name=name, n=numbers[0], item=item)} {', then '.join(steps)}. "
            f"{question.format(name=name, item=item)}")
    lines, total = [], numbers[0]
    for sign, n in zip(signs, numbers[1:]):
        after = total + n if sign == "+" else total - n
        lines.append(f"{total} {sign} {n} = {after}.")
        total = after
    return Example(text, "\n".join(lines) + f"\n#### {total}", str(total), where, story)


_STEP_LINE = re.compile(r"^\s*(\d+)\s*([+-])\s*(\d+)\s*=\s*(\d+)\.?\s*$")


def arith_steps(solution: str) -> list[tuple[int, str, int, int]]:
    """The step lines "23 + 45 = 68." of an arith solution as (left, sign, right, result)."""
    steps = []
    for line in solution.splitlines():
        match = _STEP_LINE.match(line)
        if match:
            steps.append((int(match[1]), match[2], int(match[3]), int(match[4])))
    return steps


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

# The instruction the model sees, per task (inside the chat template when the tokenizer has one).
PROMPTS = {
    "math": ("Solve the math problem. Reason step by step, then give the final answer in \\boxed{{}}.\n\n"
             "Question: {question}\nAnswer:"),
    "ecqa": ("Answer the multiple-choice question. Reason briefly, then give the letter of the correct option on "
             "its own line as 'Answer: <letter>'.\n\nQuestion: {question}\nAnswer:"),
    # Our choice: no instruction. The tiny world's model is trained from scratch on this prompt,
    # and an instruction line would double its tokens (and its compute); other models learn the
    # '#### N' format from SFT on the training solutions.
    "arith": "Question: {question}\nAnswer:",
    "gsm8k": ("Solve the math problem. Reason step by step, then give the final answer on its own line as "
              "'#### <number>'.\n\nQuestion: {question}\nAnswer:"),
}


def make_prompt(question: str, task: str = "gsm8k") -> str:
    """The prompt of a question: PROMPTS' template for the task (MATH-style tasks share one)."""
    check_task(task)
    return PROMPTS["math" if task in MATH_TASKS else task].format(question=question)
