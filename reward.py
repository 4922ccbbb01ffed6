"""The training reward: is the final answer right?

The task reward of I-PPO (arXiv 2604.01597) is exact match on the final answer: 1 for a
correct answer, 0 otherwise, with an optional penalty for a response cut off before EOS.
Model text is parsed with regular expressions and Decimal; it is never evaluated as Python.

Correctness per training task (the tasks and their data: tasks.py): gsm8k and arith compare
normalised numbers; ecqa accepts the option letter or the option's text. The MATH-style
benchmarks are test-only: answers.py checks their LaTeX answers for evaluation.

Public functions:
    extract_answer(text, task)            -> answer string, or None
    is_correct(pred, gold, task)          -> bool
    reward_fn(completion, gold, task, truncated=False, truncation_penalty=0.0, flip=False) -> float
    normalize_number(text), last_boxed(text), strip_math_delimiters(answer)
                                          the pieces tasks.py (and answers.py) also use
    check_task(name)                      refuses an unknown task name, naming the flag
"""

from __future__ import annotations

import operator
import re
from collections import deque
from decimal import Decimal, InvalidOperation
from fractions import Fraction

TASKS = ("gsm8k", "math500", "college_math", "olympiadbench", "ecqa", "arith")
MATH_TASKS = ("math500", "college_math", "olympiadbench")    # answers in \boxed{}, checked by math-verify


def check_task(name: str) -> None:
    if name not in TASKS:
        raise SystemExit(f"--dataset {name!r}: unknown task; known tasks: {', '.join(TASKS)}")


# ---------------------------------------------------------------------------------------------
# GSM8K: numbers
# ---------------------------------------------------------------------------------------------

# A number as people write it: optional sign, digits with or without thousands commas,
# optional decimals. "1,2,3" is three numbers; "5." is the number 5 ending a sentence.
_NUMBER = re.compile(r"-?(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?(?:\$\s?)?\.\d+")
_FINAL = re.compile(r"####[ \t]*([^\n]*)")   # one line each: "####\n#### 20" holds two
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


# What follows '####' must be one number or one fraction "a/b", then at most a unit or a word,
# a percent sign or a period: no second number, no operator. "#### 12+5=17" is unparsed, not 12.
_FINAL_ANSWER = re.compile(r"^\s*(?P<num>%s)(?:\s*/\s*(?P<den>%s))?(?P<rest>[^\d+\-*/=^×÷]*)$"
                           % (_NUMBER.pattern, _NUMBER.pattern))


def _final_answer(line: str) -> str | None:
    """The answer on one '####' line (the text after the marker), or None if it is not exactly
    one number or fraction. A fraction is read as its value: '3/4' -> '0.75', '8/2' -> '4';
    one without a finite decimal stays a reduced fraction ('2/6' -> '1/3'), which equals no
    number."""
    match = _FINAL_ANSWER.match(line)
    if match is None:
        return None
    num = normalize_number(match["num"])
    if match["den"] is None or num is None:
        return num
    den = normalize_number(match["den"])
    if den is None or Decimal(den) == 0:
        return None
    value = Fraction(Decimal(num)) / Fraction(Decimal(den))
    q = value.denominator
    while q % 2 == 0:
        q //= 2
    while q % 5 == 0:
        q //= 5
    if q != 1:
        return f"{value.numerator}/{value.denominator}"
    return normalize_number(format(Decimal(value.numerator) / Decimal(value.denominator), "f"))


def _extract_gsm8k(text: str) -> str | None:
    """Our choice, for gsm8k and arith (the paper says exact match and no more): when the text
    has '####' lines, the answer is that of the last one holding exactly one number or fraction
    (_final_answer), and nothing else counts; with no '####' at all, the last number anywhere
    (a base model that has not learnt the format still gets a signal)."""
    finals = _FINAL.findall(text)
    if finals:
        for line in reversed(finals):
            answer = _final_answer(line)
            if answer is not None:
                return answer
        return None
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


# ---------------------------------------------------------------------------------------------
# \boxed{...}: how ECQA's responses may give their letter, and the MATH-style benchmarks their
# answer (answers.py checks those)
# ---------------------------------------------------------------------------------------------

MAX_ANSWER_CHARS = 1000      # longer answers are not checked; the longest gold has 993 chars
MAX_BOXED_TRIES = 8          # \boxed occurrences looked at, from the last one back
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


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
    ecqa: the option letter (or the option text) after the last "Answer:".
    (The MATH-style benchmarks are test-only: answers.extract_answer reads theirs.)"""
    if task not in _EXTRACT:
        refuse_task(task)
    return _EXTRACT[task](text)


def strip_math_delimiters(answer: str) -> str:
    """'$\\frac{1}{2}$' -> '\\frac{1}{2}'; text with several $...$ spans is kept as it is."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$" and "$" not in answer[1:-1]:
        return answer[1:-1].strip()
    return answer


def _choice_equal(pred: str, gold: str) -> bool:
    letter, _, text = gold.partition(") ")
    return pred == letter or _normalize_text(pred) == _normalize_text(text)


def is_correct(pred: str | None, gold: str, task: str = "gsm8k") -> bool:
    """gsm8k, arith: exact match of normalised numbers ('1000' == '1000.00' after normalisation).
    ecqa: the right option's letter or text. (answers.is_correct checks the MATH-style ones.)"""
    if task not in _EQUAL:
        refuse_task(task)
    return pred is not None and _EQUAL[task](pred, gold)


def refuse_task(task: str) -> None:
    """An unknown task stops the run naming the flag; a MATH-style one is answers.py's."""
    check_task(task)
    raise ValueError(f"{task}: a test-only benchmark; answers.py checks its answers (math-verify)")


# Each training task's answer extraction and comparison (gsm8k and arith: numbers, as normalised strings).
_EXTRACT = {"gsm8k": _extract_gsm8k, "arith": _extract_gsm8k, "ecqa": _extract_choice}
_EQUAL = {"gsm8k": operator.eq, "arith": operator.eq, "ecqa": _choice_equal}


def reward_fn(completion: str, gold: str, task: str = "gsm8k", truncated: bool = False,
              truncation_penalty: float = 0.0, flip: bool = False) -> float:
    """1.0 for a correct final answer, else 0.0; minus `truncation_penalty` if the response
    hit the token limit before EOS (our choice: a cut-off answer still counts if correct).
    flip: planted reward noise (train.py --reward-noise): a correct answer scores as wrong
    and a wrong one as right; the truncation penalty is not flipped."""
    correct = is_correct(extract_answer(completion, task), gold, task)
    score = 1.0 if correct != flip else 0.0
    return score - (truncation_penalty if truncated else 0.0)
