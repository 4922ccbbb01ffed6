"""Answer checking and the reward.

The task reward of I-PPO (arXiv 2604.01597) is exact match on the final answer: 1 for a
correct answer, 0 otherwise, with an optional penalty for a response cut off before EOS.
Model text is parsed with regular expressions, Decimal and math-verify's LaTeX parser; it is
never evaluated as Python (no eval/exec, and not sympy's parse_expr, which calls eval). A
MATH-style check is bounded three ways: input caps (MAX_ANSWER_CHARS, MAX_NESTING_DEPTH), a
syntactic guard against huge integers (_too_costly), and a wall-clock limit
(MATH_VERIFY_TIMEOUT_S, in any thread); a check that hits one counts as a wrong answer.

Correctness per task (the tasks and their data: tasks.py): gsm8k and arith compare normalised
numbers; the MATH-style tasks compare LaTeX answers for mathematical equivalence with
math-verify (within MATH_VERIFY_TIMEOUT_S); ecqa accepts the option letter or the option's text.

Public functions:
    extract_answer(text, task)            -> answer string, or None
    is_correct(pred, gold, task)          -> bool
    reward_fn(completion, gold, task, truncated=False, truncation_penalty=0.0, flip=False) -> float
    normalize_number(text), last_boxed(text), strip_math_delimiters(answer)
                                          the pieces tasks.py also uses on gold answers
    check_task(name)                      refuses an unknown task name, naming the flag
"""

from __future__ import annotations

import ctypes
import logging
import operator
import re
import signal
import threading
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
    check_task(task)
    return _EXTRACT.get(task, _extract_gsm8k)(text)


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


def strip_math_delimiters(answer: str) -> str:
    """'$\\frac{1}{2}$' -> '\\frac{1}{2}'; text with several $...$ spans is kept as it is."""
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$" and "$" not in answer[1:-1]:
        return answer[1:-1].strip()
    return answer


def _plain_form(answer: str) -> str:
    """A spelling-insensitive form for a first, cheap string comparison: no $ or \\$, spaces,
    \\left/\\right, \\! \\, \\; spacing, final period; \\dfrac and \\tfrac become \\frac;
    \\text{..}, \\mathrm{..} keep only their content; words-only answers are lower-cased."""
    s = strip_math_delimiters(answer.replace("\\$", ""))
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
    check_task(task)
    return pred is not None and _EQUAL.get(task, operator.eq)(pred, gold)


# Each task's answer extraction and comparison; gsm8k and arith: the numbers' (normalised strings).
_EXTRACT = {"ecqa": _extract_choice, **{task: _extract_math for task in MATH_TASKS}}
_EQUAL = {"ecqa": _choice_equal, **{task: _math_equal for task in MATH_TASKS}}


def reward_fn(completion: str, gold: str, task: str = "gsm8k", truncated: bool = False,
              truncation_penalty: float = 0.0, flip: bool = False) -> float:
    """1.0 for a correct final answer, else 0.0; minus `truncation_penalty` if the response
    hit the token limit before EOS (our choice: a cut-off answer still counts if correct).
    flip: planted reward noise (train.py --reward-noise): a correct answer scores as wrong
    and a wrong one as right; the truncation penalty is not flipped."""
    correct = is_correct(extract_answer(completion, task), gold, task)
    score = 1.0 if correct != flip else 0.0
    return score - (truncation_penalty if truncated else 0.0)
