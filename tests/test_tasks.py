"""Loading the tasks (tasks.py): the shipped files, the hub (faked), the prompts' inputs, and bad
data named by file and line. (The arith generator has its own file, test_arith.py.)"""
import sys
import types

import pytest

import tasks
from tasks import load_task
from answers import is_correct
from reward import reward_fn

ROWS = {"math500": 500, "college_math": 2818, "olympiadbench": 675}


def test_load_local_gsm8k():
    task = load_task("gsm8k", "train", source="local")
    assert len(task.examples) == 7473 and "local file data/gsm8k/train.jsonl" in task.source
    first = task.examples[0]
    assert first.gold == "72" and "<<" not in first.solution and first.solution.endswith("#### 72")
    assert len(load_task("gsm8k", "test", source="local").examples) == 1319


@pytest.mark.parametrize("content,message", [
    (b'{"question": "q", "answer": "a #### 1"}\n{not json\n', ":2: not valid JSON"),
    (b'{"question": "q"}\n', ":1: missing or non-string field 'answer'"),
    (b'{"question": "q", "answer": "no marker"}\n', ":1: the answer has no '#### N'"),
    (b'{"question": "q", "answer": "#### many"}\n', ":1: the final answer after '####' is not a number"),
    (b'', ": no examples (the file is empty)"),
    (b'{"question": "q\xff", "answer": "#### 1"}\n', ":1: not valid UTF-8"),
])
def test_bad_data_names_file_and_line(tmp_path, monkeypatch, content, message):
    (tmp_path / "gsm8k").mkdir()
    path = tmp_path / "gsm8k" / "train.jsonl"
    path.write_bytes(content)
    monkeypatch.setattr(tasks, "DATA_DIR", tmp_path)
    with pytest.raises(SystemExit) as err:
        load_task("gsm8k", "train", source="local")
    assert str(path) + message in str(err.value)


def test_unknown_task_and_missing_file(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="--dataset 'nope': unknown task"):
        load_task("nope", "train")
    monkeypatch.setattr(tasks, "DATA_DIR", tmp_path)
    with pytest.raises(SystemExit, match="data file not found"):
        load_task("gsm8k", "train", source="local")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_shipped_file_loads_every_row(name):
    path = tasks.DATA_DIR / name / "test.jsonl"
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    task = load_task(name, "test")
    assert len(lines) == len(task.examples) == ROWS[name]
    assert task.source == f"local file data/{name}/test.jsonl" + (" (offline)" if name == "math500" else "")
    assert all(e.question and e.gold and e.solution for e in task.examples)
    assert task.examples[-1].where == f"{path}:{len(lines)}"


def test_college_math_and_olympiadbench_golds_lose_their_dollars():
    college = load_task("college_math", "test").examples
    assert college[0].gold == "10-4 n" and college[1].gold == "(45,2),(-10,-9)"
    olympiad = load_task("olympiadbench", "test").examples
    assert olympiad[13].gold == "69,84"                 # the row says ["$69$,$84$"]
    assert all("$" not in e.gold for e in olympiad)
    assert all(e.solution.endswith(f"\\boxed{{{e.gold}}}.") for e in olympiad)


def test_olympiadbench_several_final_answers_become_one_set(tmp_path, monkeypatch):
    row = {"question": "q", "solution": ["s"], "final_answer": ["$1$", "$\\frac{1}{2}$"]}
    example = tasks._parse_olympiadbench_row(row, "x:1")
    assert example.gold == "1,\\frac{1}{2}"
    assert is_correct("0.5, 1", example.gold, "olympiadbench")
    assert not is_correct("1", example.gold, "olympiadbench")


@pytest.mark.parametrize("name", sorted(ROWS))
def test_no_train_split_says_so(name):
    with pytest.raises(SystemExit, match=f"--dataset {name}: no 'train' split is available offline"):
        load_task(name, "train")


def test_ecqa_has_no_offline_copy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for split, source in [("train", "auto"), ("test", "auto"), ("train", "local")]:
        with pytest.raises(SystemExit, match="--dataset ecqa: no offline copy exists; it loads from the hub"):
            load_task("ecqa", split, source)


def _fake_hub(monkeypatch, rows=None, error=None):
    """datasets.load_dataset replaced: returns `rows`, or raises `error`."""
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        if error is not None:
            raise error
        return rows

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return calls


ECQA_ROW = {"q_text": "Why do people fear the unknown?", "q_op1": "knowledge", "q_op2": "ignorance",
            "q_op3": "light", "q_op4": "joy", "q_op5": "food", "q_ans": "ignorance",
            "taskB": "Not knowing something makes people afraid of it."}


def test_ecqa_from_the_hub(monkeypatch):
    calls = _fake_hub(monkeypatch, rows=[ECQA_ROW])
    task = load_task("ecqa", "train")
    assert calls == [("tasksource/ecqa", None, "train")]
    assert task.source == "hub tasksource/ecqa (default/train)"
    (e,) = task.examples
    assert e.gold == "B) ignorance" and e.question.endswith("\nA) knowledge\nB) ignorance\nC) light\nD) joy\nE) food")
    assert e.solution.endswith("\nAnswer: B") and reward_fn(e.solution, e.gold, "ecqa") == 1.0


def test_ecqa_bad_row_names_its_place(monkeypatch):
    _fake_hub(monkeypatch, rows=[ECQA_ROW, {**ECQA_ROW, "q_ans": "fear"}])
    with pytest.raises(SystemExit, match=r"hub:tasksource/ecqa/test\[1\]: the answer 'fear' is none of the five"):
        load_task("ecqa", "test")
    _fake_hub(monkeypatch, rows=[{k: v for k, v in ECQA_ROW.items() if k != "q_op3"}])
    with pytest.raises(SystemExit, match=r"test\[0\]: missing, empty or non-string field 'q_op3'"):
        load_task("ecqa", "test")


def test_ecqa_unreachable_hub(monkeypatch):
    _fake_hub(monkeypatch, error=ConnectionError("no route to host"))
    with pytest.raises(SystemExit, match=r"no offline copy exists.*could not be reached \(no route to host\)"):
        load_task("ecqa", "train")


def test_math500_from_the_hub_and_its_fallback(monkeypatch):
    row = {"problem": "What is 1/2 + 1/2?", "solution": r"It is $\boxed{1}$.", "answer": "1"}
    _fake_hub(monkeypatch, rows=[row])
    task = load_task("math500", "test")
    assert task.source == "hub HuggingFaceH4/MATH-500 (default/test)" and task.examples[0].gold == "1"
    _fake_hub(monkeypatch, error=OSError("offline"))
    task = load_task("math500", "test")
    assert len(task.examples) == 500 and task.source == "local file data/math500/test.jsonl (hub not used: offline)"


BAD_ROWS = [
    # (task, file content, message after "<path>")
    ("math500", b'{"question": "q", "answer": "\\\\boxed{1}"}\n{not json\n', ":2: not valid JSON"),
    ("math500", b'{"question": "q"}\n', ":1: missing, empty or non-string field 'answer'"),
    ("math500", b'{"question": "q", "answer": "no box. The answer is: 1"}\n', ":1: the solution has no \\boxed{...}"),
    ("math500", b'[1, 2]\n', ":1: expected a JSON object"),
    ("math500", b'', ": no examples (the file is empty)"),
    ("math500", b'{"question": "q\xff", "answer": "\\\\boxed{1}"}\n', ":1: not valid UTF-8"),
    ("college_math", b'{"question": "q", "answer": "$1$"}\n\n{"question": "q", "answer": 2}\n',
     ":3: missing, empty or non-string field 'answer'"),
    ("college_math", b'{"question": "q", "answer": "$ $"}\n', ":1: the answer is empty"),
    ("olympiadbench", b'{"question": "q", "solution": ["s"], "final_answer": "$1$"}\n',
     ":1: field 'final_answer' must be a non-empty list"),
    ("olympiadbench", b'{"question": "q", "solution": [], "final_answer": ["1"]}\n',
     ":1: field 'solution' must be a non-empty list"),
    ("olympiadbench", b'{"question": "q", "solution": ["s"], "final_answer": ["$$"]}\n',
     ":1: an entry of 'final_answer' holds nothing but $ signs"),
    ("gsm8k", b'{"question": "q", "answer": "no marker"}\n', ":1: the answer has no '#### N'"),
]


@pytest.mark.parametrize("task,content,message", BAD_ROWS)
def test_bad_rows_name_file_and_line(tmp_path, monkeypatch, task, content, message):
    (tmp_path / task).mkdir()
    path = tmp_path / task / ("test.jsonl" if task != "gsm8k" else "train.jsonl")
    path.write_bytes(content)
    monkeypatch.setattr(tasks, "DATA_DIR", tmp_path)
    with pytest.raises(SystemExit) as err:
        load_task(task, "test" if task != "gsm8k" else "train", source="local")
    assert str(path) + message in str(err.value)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_missing_file_and_unknown_name(tmp_path, monkeypatch, name):
    monkeypatch.setattr(tasks, "DATA_DIR", tmp_path)
    with pytest.raises(SystemExit, match=f"{tmp_path / name / 'test.jsonl'}: data file not found"):
        load_task(name, "test", source="local")
    with pytest.raises(SystemExit, match="--dataset 'math5000': unknown task; known tasks: gsm8k, math500"):
        load_task("math5000", "test")
