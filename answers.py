"""Answer checking for evaluation: every task, the MATH-style benchmarks included.

The training reward (reward.py) checks the training tasks' answers: gsm8k and arith compare
normalised numbers, ecqa an option letter or text. The MATH-style benchmarks (math500,
college_math, olympiadbench) are test-only, and their answers are LaTeX: this file reads the
last \\boxed{} and compares it with the gold answer for mathematical equivalence, first as
strings, then with math-verify's LaTeX parser and sympy. accuracy.py checks every evaluation
answer here; for any other task these functions are reward.py's.

Model text is never evaluated as Python (no eval/exec, and not sympy's parse_expr, which
calls eval). One check is bounded three ways: input caps (reward.MAX_ANSWER_CHARS,
MAX_NESTING_DEPTH), a syntactic guard against huge integers (_too_costly), and a wall-clock
limit (MATH_VERIFY_TIMEOUT_S, in any thread); a check that hits one counts as a wrong answer.

Public functions:
    extract_answer(text, task)            -> answer string, or None
    is_correct(pred, gold, task)          -> bool
"""

from __future__ import annotations

import ctypes
import logging
import re
import signal
import threading

import reward
from reward import MATH_TASKS, MAX_ANSWER_CHARS, last_boxed, strip_math_delimiters

# Bounds on checking one MATH-style answer (our choices; an answer past one counts as wrong):
MATH_VERIFY_TIMEOUT_S = 2.0  # wall-clock limit for one comparison (parse both, then verify)
MAX_NESTING_DEPTH = 8        # deeper ( [ { nesting is not checked: the LaTeX parser needs about
                             # 1 s at 10 levels, minutes at 100; the deepest gold has 5
MAX_EXPONENT_DIGITS = 4      # 2^{12345} is not checked: sympy would build a huge integer

_ANSWER_IS = re.compile(r"answer is:?\s*([^\n]{1,%d})" % MAX_ANSWER_CHARS, re.IGNORECASE)


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
# Checking MATH-style answers: string match, then math-verify under a time limit
# ---------------------------------------------------------------------------------------------

class _CheckTimeout(BaseException):
    """Raised inside a check that ran out of time. A BaseException, so that the `except
    Exception` clauses inside math-verify and sympy do not swallow it."""


class _Drained(BaseException):
    """Sent by a watchdog's own thread to itself, and caught at once: see _run_with_watchdog."""


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

    threading.Thread(target=watchdog, name="answer-check-watchdog", daemon=True).start()
    try:
        return fn()
    finally:
        # The watchdog must send nothing more, and a _CheckTimeout it sent but that has not been
        # raised yet must not land later. Clearing it with send(target, None) is not enough: in
        # CPython 3.11 that leaves the thread's pending-exception flag set with nothing to raise,
        # and code run afterwards under sys.setprofile or settrace (a profiler, a debugger,
        # bench/reading_path.py) then loops for ever. So a _Drained replaces whatever is pending
        # and is raised here, between two bytecodes of the loop below, which clears the flag.
        while True:
            try:
                with lock:
                    done.set()
                send(target, ctypes.py_object(_Drained))
                while True:
                    pass
            except _CheckTimeout:   # one sent before done was set landed first: drain again
                continue
            except _Drained:
                break


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


def extract_answer(text: str, task: str = "gsm8k") -> str | None:
    """The final answer of a completion, or None. MATH-style tasks: the last \\boxed{...},
    else what follows the last "answer is" (_extract_math); every other task: reward.py's."""
    if task in MATH_TASKS:
        return _extract_math(text)
    return reward.extract_answer(text, task)


def is_correct(pred: str | None, gold: str, task: str = "gsm8k") -> bool:
    """MATH-style tasks: `pred` is mathematically equivalent to `gold` (_math_equal); every other
    task: reward.py's exact match."""
    if task in MATH_TASKS:
        return pred is not None and _math_equal(pred, gold)
    return reward.is_correct(pred, gold, task)
