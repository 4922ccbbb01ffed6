"""The exercises (exercises/): the grader fails every blank stub and every planted mistake with
the words that name it, and passes the project's own code; a handout carries no solution."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exercises"))

import grade  # noqa: E402
import handout  # noqa: E402
from catalog import BY_NAME, EXERCISES  # noqa: E402
from mistakes import WRONG  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


@pytest.fixture(scope="module")
def fixtures():
    return grade.Fixtures()


def replaced(source: str, functions: dict) -> str:
    """The module source with each named function ("name" or "Class.method") replaced by the
    given source, indented to its place."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    for qualified, new in sorted(functions.items(), key=lambda kv: -grade.find(tree, kv[0]).lineno):
        node = grade.find(tree, qualified)
        indent = " " * node.col_offset
        body = "".join(indent + line if line.strip() else line for line in new.strip("\n").splitlines(keepends=True))
        lines[node.lineno - 1:node.end_lineno] = [body + "\n"]
    return "".join(lines)


def verdict(exercise, source, fixtures):
    return grade.grade_exercise(exercise, source, fixtures, str(ROOT / exercise.file))


def reference(exercise):
    return (ROOT / exercise.file).read_text()


def test_every_exercise_has_a_planted_mistake_and_tests_that_exist():
    for exercise in EXERCISES:
        assert WRONG.get(exercise.name), f"no planted mistake for {exercise.name}"
        for spec in exercise.tests:
            path, name = spec.split("::")
            assert f"def {name}(" in (ROOT / path).read_text(), spec


@pytest.mark.parametrize("name", [e.name for e in EXERCISES])
def test_the_grader_fails_the_stub_and_each_planted_mistake_and_passes_the_reference(name, fixtures):
    exercise = BY_NAME[name]
    stub, _ = handout.blank(reference(exercise), exercise)
    result = verdict(exercise, stub, fixtures)
    assert not result["passed"] and result["message"].startswith("not written yet"), result
    for what, says, functions in WRONG[name]:
        result = verdict(exercise, replaced(reference(exercise), functions), fixtures)
        assert not result["passed"], f"{name}: the planted mistake '{what}' passed"
        assert says in result["message"], f"{name}: '{what}' failed with: {result['message']}"
    result = verdict(exercise, reference(exercise), fixtures)
    assert result["passed"], result
    assert all(c["passed"] for c in result["checks"]) and len(result["checks"]) == len(exercise.tests)


def test_a_student_error_names_the_line_of_their_file(fixtures, tmp_path):
    exercise = BY_NAME["filter"]
    wrong = replaced(reference(exercise), {"filter_and_reweight": '''
def filter_and_reweight(scores):
    keep = scores > 0
    return keep, scores[keep] / undefined_name
'''})
    path = tmp_path / "influence.py"
    path.write_text(wrong)
    result = grade.grade_exercise(exercise, wrong, fixtures, str(path))
    line = wrong.splitlines().index("    return keep, scores[keep] / undefined_name") + 1
    assert result["message"].startswith("NameError") and f"line {line} of your influence.py" in result["message"]


def test_a_students_helper_function_is_graded_with_their_code(fixtures):
    exercise = BY_NAME["influence_scores"]
    source = reference(exercise) + '''

def my_dot(a, b):
    return (a.double() @ b.double()).float()
'''
    source = replaced(source, {"influence_scores": '''
def influence_scores(episode_grads, g_val):
    return my_dot(episode_grads, g_val)
'''})
    assert verdict(exercise, source, fixtures)["passed"]


def test_a_students_constants_and_helper_methods_are_graded_with_their_code(fixtures):
    exercise = BY_NAME["lora"]
    source = replaced(reference(exercise), {"LoRALinear.forward": '''
def _update(self, x, A, B):
    return self.scale * ((x.to(A.dtype) @ A.T) @ B.T) * ONE


def forward(self, x):
    y = self.base(x)
    A, B = (self.lora_A, self.lora_B) if self.enabled else (self.ref_A, self.ref_B)
    return y if A is None else y + self._update(x, A, B).to(y.dtype)
'''}) + "\nONE = 1.0\n"
    assert verdict(exercise, source, fixtures)["passed"]
    from model import LoRALinear
    assert not hasattr(LoRALinear, "_update")                              # taken away after grading


def test_a_copy_from_the_handout_carries_no_solution_and_grades_as_written(tmp_path, fixtures):
    copy = handout.main([str(tmp_path / "student")])
    assert not (copy / "tests").exists() and not (copy / "exercises").exists() and (copy / "EXERCISES.md").exists()
    log = subprocess.run(["git", "log", "--format=%s"], cwd=copy, capture_output=True, text=True, check=True).stdout
    assert log.strip() == "The handout"                                    # one commit, none of the project's
    for exercise in EXERCISES:                                            # every body is gone, word for word
        text = (copy / exercise.file).read_text()
        for qualified in exercise.functions:
            node = grade.find(ast.parse(reference(exercise)), qualified)
            start, end = handout.body_lines(node)
            body = reference(exercise).splitlines()[start - 1:end]
            assert "\n".join(body) not in text
            assert f'raise NotImplementedError("exercise {exercise.name}' in text
    grades = grade.grade(copy, EXERCISES)
    assert grades["passed"] == 0 and all(r["message"].startswith("not written yet") for r in grades["exercises"])
    for exercise in EXERCISES:                                            # the answers put back: every exercise passes
        (copy / exercise.file).write_text(reference(exercise))
    assert grade.grade(copy, EXERCISES)["passed"] == len(EXERCISES)


def test_the_handout_finds_a_solution_line_anywhere_in_the_copy_and_then_keeps_no_copy(tmp_path, monkeypatch):
    exercise = BY_NAME["policy_loss"]
    _, removed = handout.blank(reference(exercise), exercise)
    (tmp_path / "notes.txt").write_text("    unclipped   =   -advantages * ratio\n")   # spacing aside
    assert handout.leaks(tmp_path, removed) == [("unclipped = -advantages * ratio", "notes.txt")]
    monkeypatch.setattr(handout, "leaks", lambda copy, removed: [("a line", "notes.txt")])
    with pytest.raises(SystemExit, match="would carry a solution"):
        handout.main([str(tmp_path / "student"), "--exercises", "policy_loss", "--no-git"])
    assert not (tmp_path / "student").exists()


def test_the_grade_command_writes_json(tmp_path):
    out = tmp_path / "grades.json"
    grades = grade.main([str(ROOT), "--exercises", "filter,influence_scores", "--json", str(out)])
    assert json.loads(out.read_text()) == grades and grades["passed"] == grades["total"] == 2
