"""Tasks: loading a data set, the prompt, answer extraction, correctness and the reward.

The task reward of I-PPO (arXiv 2604.01597) is exact match on the final answer: 1 for a
correct answer, 0 otherwise, with an optional penalty for a response cut off before EOS.
Model text is parsed with regular expressions and Decimal only; it is never evaluated.

Public functions:
    load_task(name, split, source="auto") -> Task (examples + where they came from)
    make_prompt(question, task)           -> the instruction text given to the model
    extract_answer(text, task)            -> normalised answer string, or None
    is_correct(pred, gold, task)          -> bool
    reward_fn(completion, gold, task, truncated=False, truncation_penalty=0.0) -> float
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
TASKS = ("gsm8k",)
HUB_IDS = {"gsm8k": ("openai/gsm8k", "main")}


@dataclass
class Example:
    question: str
    solution: str   # reference solution text (reasoning, then "#### N"), used for SFT and g_val
    gold: str       # normalised final answer
    where: str      # "file:line" or "hub:openai/gsm8k/train[i]", for error messages


@dataclass
class Task:
    name: str
    split: str
    examples: list[Example]
    source: str     # what was loaded, said in logs and saved in the run directory


def load_task(name: str, split: str, source: str = "auto") -> Task:
    """Load a task split. source: "hub", "local" (the files shipped in data/), or "auto"
    (the hub unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set or it cannot be reached)."""
    if name not in TASKS:
        raise SystemExit(f"--dataset {name!r}: unknown task; known tasks: {', '.join(TASKS)}")
    if split not in ("train", "test"):
        raise SystemExit(f"task {name}: unknown split {split!r} (train or test)")
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    hub_error = None
    if source == "hub" or (source == "auto" and not offline):
        try:
            return _load_from_hub(name, split)
        except (OSError, ConnectionError, ValueError) as err:  # no network, no such dataset
            if source == "hub":
                raise SystemExit(f"--data-source hub: could not load {HUB_IDS[name][0]}: {err}") from err
            hub_error = str(err).splitlines()[0]
    path = DATA_DIR / name / f"{split}.jsonl"
    examples = _read_jsonl(path)
    why = f" (hub not used: {hub_error})" if hub_error else (" (offline)" if source == "auto" else "")
    return Task(name, split, examples, f"local file {path.relative_to(DATA_DIR.parent)}{why}")


def _load_from_hub(name: str, split: str) -> Task:
    import datasets

    repo, config = HUB_IDS[name]
    rows = datasets.load_dataset(repo, config, split=split)
    examples = [_parse_row(row, f"hub:{repo}/{split}[{i}]") for i, row in enumerate(rows)]
    return Task(name, split, examples, f"hub {repo} ({config}/{split})")


def _read_jsonl(path: Path) -> list[Example]:
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
            examples.append(_parse_row(row, where))
    if not examples:
        raise SystemExit(f"{path}: no examples (the file is empty)")
    return examples


def _parse_row(row, where: str) -> Example:
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


def make_prompt(question: str, task: str = "gsm8k") -> str:
    """The instruction the model sees (inside the chat template when the tokenizer has one)."""
    return ("Solve the math problem. Reason step by step, then give the final answer "
            "on its own line as '#### <number>'.\n\n"
            f"Question: {question}\nAnswer:")


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


def extract_answer(text: str, task: str = "gsm8k") -> str | None:
    """The final answer of a completion: the number after the last '####', else the last
    number anywhere in the text; normalised, or None if there is none."""
    finals = _FINAL.findall(text)
    if finals:
        answer = normalize_number(finals[-1])
        if answer is not None:
            return answer
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def is_correct(pred: str | None, gold: str, task: str = "gsm8k") -> bool:
    """Exact match of normalised numbers ('1000' == '1000.00' after normalisation)."""
    return pred is not None and pred == gold


def reward_fn(completion: str, gold: str, task: str = "gsm8k", truncated: bool = False,
              truncation_penalty: float = 0.0) -> float:
    """1.0 for a correct final answer, else 0.0; minus `truncation_penalty` if the response
    hit the token limit before EOS (our choice: a cut-off answer still counts if correct)."""
    score = 1.0 if is_correct(extract_answer(completion, task), gold, task) else 0.0
    return score - (truncation_penalty if truncated else 0.0)
