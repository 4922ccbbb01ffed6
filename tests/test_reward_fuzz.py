"""Property tests for every task: the answer checks (answers.py, reward.py's for the training
tasks) and the training reward never raise, return within a stated time, never run model text,
and find an answer however much noise precedes it."""

import builtins
import os
import subprocess
import time
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import reward
from answers import MATH_VERIFY_TIMEOUT_S, extract_answer, is_correct
from reward import MATH_TASKS, TASKS, reward_fn
from tasks import load_task

CALL_BOUND_S = MATH_VERIFY_TIMEOUT_S + 1.5   # one is_correct / reward_fn call, with slack for a busy machine
# deadline=None: the time bounds are asserted by the tests themselves, per call. derandomize:
# the same examples on every run, so that a CI failure can be reproduced.
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])

GOLDS = {"gsm8k": "72", "math500": r"\left( 3, \frac{\pi}{2} \right)", "college_math": "(45,2),(-10,-9)",
         "olympiadbench": "69,84", "ecqa": "B) ignorance", "arith": "68"}

CANARY = "pwnedcanary"
PAYLOADS = [f"__import__('os').system('touch {CANARY}')", f"exec('{CANARY} = 1')", f"eval('{CANARY}')",
            f"open('{CANARY}', 'w').write('x')", f"\\boxed{{__import__('subprocess').run(['touch', '{CANARY}'])}}",
            f"$\\operatorname{{{CANARY}}}(1)$", f"\\text{{{CANARY}}}", f"{CANARY}()", "lambda: 0", "__class__"]
PIECES = [r"\boxed{", r"\fbox{", "{", "}", r"\frac{", r"\dfrac", "^", "_", "10^{", "9^9^", "!", r"\sqrt{",
          r"\left(", r"\right)", "(", ")", "[", "]", ",", "$", r"\$", "####", "Answer:", "answer is", "The answer is:",
          r"\text{", r"^\circ", r"\%", r"\binom{", r"\prod_{k=1}^{", r"\infty", r"\cup", "=", "-", "+", ".", "x",
          "pi", r"\pi", "A)", "(B)", "E", " ", "\n", "0", "1", "7", "9" * 40, "1,000", "-3.5",
          "٣", "５", "𝟕", "७", "³", "½", "Ⅻ",                         # digits from other scripts
          "\x00", "\x07", "\x1b[31m", "\r", "\u202e", "\ufeff", "\ud800"]  # control, bidi, BOM, lone surrogate
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(PIECES + PAYLOADS), max_size=80).map("".join),
    st.integers(1, 3000).map(lambda k: r"\boxed{" * k + "1" + "}" * k),              # nested \boxed
    st.integers(1, 300).map(lambda k: "10^{" * k + "10" + "}" * k),                  # power towers
    st.integers(100, 1_000_000).map(lambda n: st_pick(n)),                          # huge numbers
)


def st_pick(n: int) -> str:
    """A huge number in one of the answer formats, chosen by n."""
    digits = "9" * n
    return (f"#### {digits}", f"\\boxed{{{digits}}}", f"Answer: {digits}", f"2^{{{digits}}}")[n % 4]


MEGABYTE = [
    "x" * 1_000_000,
    "#### " + "9" * 1_000_000,                 # 10^6 digits
    r"\boxed{" + "9" * 1_000_000 + "}",
    r"\boxed{" * 100_000 + "1" + "}" * 100_000,
    "(" * 500_000 + "1" + ")" * 500_000,
    "Answer: " * 125_000,
    "\n" * 1_000_000,
    "The answer is " + "1+" * 500_000,
]


@contextmanager
def nothing_runs():
    """Record every eval/exec and block every way to start a process, while the body runs.
    Yields the list of eval/exec sources and process attempts; recording (not raising) because
    math-verify and sympy catch Exception and would hide a raise."""
    seen = {"eval_exec": [], "process": []}
    real_eval, real_exec = builtins.eval, builtins.exec

    def spy(real):
        def run(source, *args, **kwargs):
            seen["eval_exec"].append(source if isinstance(source, str) else repr(getattr(source, "co_names", source)))
            return real(source, *args, **kwargs)
        return run

    def blocked(*args, **kwargs):
        seen["process"].append(args)
        raise PermissionError("tests/test_reward_fuzz.py: no process may start")

    saved = {name: getattr(os, name) for name in ("system", "popen", "execv", "execve", "execvp", "spawnv")}
    saved_popen = subprocess.Popen
    builtins.eval, builtins.exec = spy(real_eval), spy(real_exec)
    for name in saved:
        setattr(os, name, blocked)
    subprocess.Popen = blocked
    try:
        yield seen
    finally:
        builtins.eval, builtins.exec = real_eval, real_exec
        for name, fn in saved.items():
            setattr(os, name, fn)
        subprocess.Popen = saved_popen


def check_one(text: str, task: str) -> None:
    """The properties, for one text and one task."""
    gold = GOLDS[task]
    with nothing_runs() as seen:
        t0 = time.perf_counter()
        pred = extract_answer(text, task)
        t1 = time.perf_counter()
        correct = is_correct(pred, gold, task)
        t2 = time.perf_counter()
        score = None if task in MATH_TASKS else reward_fn(text, gold, task, truncated=True, truncation_penalty=0.25)
        t3 = time.perf_counter()
        direct = is_correct(text, gold, task)    # the whole text as an answer: caps must hold
        t4 = time.perf_counter()
    assert pred is None or (isinstance(pred, str) and pred.strip() == pred and pred)
    if pred is not None and task in MATH_TASKS:
        assert len(pred) <= reward.MAX_ANSWER_CHARS
    if pred is not None and task == "ecqa":
        assert pred in "ABCDE" or pred == reward._normalize_text(pred)
    assert isinstance(correct, bool) and isinstance(direct, bool)
    assert score == (0.75 if correct else -0.25) or (task in MATH_TASKS and score is None)   # test-only: no reward
    assert t1 - t0 <= 1.0 and t2 - t1 <= CALL_BOUND_S and t3 - t2 <= CALL_BOUND_S and t4 - t3 <= CALL_BOUND_S
    assert seen["process"] == []
    assert not any(CANARY in source for source in seen["eval_exec"]), seen["eval_exec"]


@pytest.mark.parametrize("task", TASKS)
@settings(FUZZ, max_examples=100)
@given(text=TEXT)
@example(text="")
@example(text=" ".join(PAYLOADS))
def test_never_raises_returns_in_time_and_runs_nothing(task, text):
    check_one(text, task)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("text", MEGABYTE, ids=lambda s: repr(s[:12]))
def test_megabyte_inputs(task, text):
    check_one(text, task)


def test_no_canary_file_was_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for task in TASKS:
        for payload in PAYLOADS:
            check_one(payload, task)
            check_one(f"\\boxed{{{payload}}}\nAnswer: {payload}\n#### {payload}", task)
    assert list(tmp_path.iterdir()) == []


# Real golds from the shipped files: noise before the final answer must not change the reward.
SHIPPED_GOLDS = {name: [e.gold for e in load_task(name, "test").examples[::25]] for name in MATH_TASKS}


@pytest.mark.parametrize("task", MATH_TASKS)
@FUZZ
@given(data=st.data(), prefix=TEXT, suffix=st.text(max_size=100))
def test_noise_around_a_boxed_answer_keeps_it_correct(task, data, prefix, suffix):
    gold = data.draw(st.sampled_from(SHIPPED_GOLDS[task]))
    suffix = suffix.replace("\\", "/")   # a suffix without backslashes holds no later \boxed
    assert is_correct(extract_answer(f"{prefix}\\boxed{{{gold}}}{suffix}", task), gold, task)


@FUZZ
@given(prefix=TEXT, letter=st.sampled_from("ABCDE"))
def test_noise_before_the_ecqa_answer_keeps_the_reward(prefix, letter):
    gold = f"{letter}) some option"
    assert reward_fn(f"{prefix}\nAnswer: {letter}", gold, "ecqa") == 1.0
    assert reward_fn(f"{prefix}\nAnswer: {'ABCDE'[('ABCDE'.index(letter) + 1) % 5]}", gold, "ecqa") == 0.0


@FUZZ
@given(prefix=TEXT, number=st.integers(-10**12, 10**12))
def test_noise_before_the_gsm8k_answer_keeps_the_reward(prefix, number):
    assert reward_fn(f"{prefix}\n#### {number:,}", str(number), "gsm8k") == 1.0
