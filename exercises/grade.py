"""Grade a student's copy: per exercise, passed, or what went wrong in words.

    python exercises/grade.py COPY [--exercises gae,...] [--json grades.json]

For each exercise, the student's file is imported from COPY as a module of its own (its imports
of the other concept files get the project's), its functions for the exercise are put in the
place of the project's own, one exercise at a time (so that one wrong answer does not fail the
next exercise), and the exercise's tests run: the project's own oracle tests from tests/ (catalog.py lists them), in one
process, without pytest. The first test that fails gives the exercise's message; the tests that
catch a classic mistake say so in words. The grades are printed and written as JSON (--json) for
a course's autograder: {"exercises": [{"name", "passed", "message", "checks": [...]}, ...],
"passed", "total"}.

Run it from the instructor's copy of the project (the one with tests/), never from the student's.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import sys
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from catalog import EXERCISES, Exercise, chosen  # noqa: E402

NOT_WRITTEN = "not written yet: {what} still raise{s} NotImplementedError"


# ----------------------------------------------------------------------------- the student's code

def student_code(source: str, exercise: Exercise, filename: str) -> dict:
    """{qualified name: function object} of the exercise's functions in the student's module
    source, imported as a module of its own (its imports of the other concept files resolve to
    the project's, so that each exercise is graded alone); for an exercise on a class's method,
    the methods the student added to that class too."""
    tree = ast.parse(source, filename)   # a SyntaxError names the student's line
    for qualified in exercise.functions:
        node = find(tree, qualified)
        if node is None:
            raise LookupError(f"{exercise.file} has no {qualified} any more: keep its name and signature")
        if any(isinstance(n, ast.Name) and n.id == "speedups" or isinstance(n, ast.ImportFrom) and n.module == "speedups"
               or isinstance(n, ast.Import) and any(a.name == "speedups" for a in n.names) for n in ast.walk(node)):
            raise LookupError(f"{qualified} uses speedups.py: write the definition itself, not the speed-up")
    student = load_module(source, exercise)
    project = importlib.import_module(exercise.file.removesuffix(".py"))
    functions = {}
    for qualified in exercise.functions:
        owner, _, name = qualified.rpartition(".")
        cls = getattr(student, owner) if owner else None
        functions[qualified] = cls.__dict__[name] if cls else getattr(student, name)
        if cls:   # methods the student added to the class
            functions |= {f"{owner}.{k}": v for k, v in vars(cls).items()
                          if inspect.isfunction(v) and not hasattr(getattr(project, owner), k)}
    return functions


_loaded = itertools.count()


def load_module(source: str, exercise: Exercise):
    """The student's module source imported under a name of its own, from a file that bears the
    concept file's name (so that a traceback names it), in a fresh temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="student-"))
    path = folder / exercise.file
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"student_{next(_loaded)}_{path.stem}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)   # dataclasses look it up there
    try:
        spec.loader.exec_module(module)
    except Exception as err:   # noqa: BLE001: what stops the student's file from importing, in words
        raise LookupError(f"your {exercise.file} does not import: {type(err).__name__}: {err}") from err
    finally:
        del sys.modules[spec.name]
    return module


def find(tree: ast.Module, qualified: str):
    scope, node = tree.body, None
    for part in qualified.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return node


def bound(module, name: str):
    """module.name, or None (some modules raise more than AttributeError for a name they lack)."""
    try:
        return getattr(module, name, None)
    except Exception:   # noqa: BLE001
        return None


@contextmanager
def installed(exercise: Exercise, functions: dict):
    """The student's functions in place of the project's, wherever the project's are bound: the
    module, every module that imported them by name (the tests, train.py), or the class."""
    module = importlib.import_module(exercise.file.removesuffix(".py"))
    undo = []
    for qualified, new in functions.items():
        if "." in qualified:
            owner_name, name = qualified.split(".")
            owners = [getattr(module, owner_name)]
        else:
            name = qualified
            owners = [m for m in list(sys.modules.values()) if bound(m, name) is getattr(module, name)]
        for owner in owners:
            undo.append((owner, name, owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)))
            setattr(owner, name, new)
    try:
        yield
    finally:
        for owner, name, old in reversed(undo):
            if old is None and isinstance(owner, type):
                delattr(owner, name)        # a method the student added
            else:
                setattr(owner, name, old)


# ----------------------------------------------------------------------------- the tests

class Fixtures:
    """What the graded tests may ask for, made once per grading (tiny_dir) or per test."""

    def __init__(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="grade-"))
        self._tiny = None

    def tiny_dir(self):
        if self._tiny is None:
            from transformers.utils import logging
            from tiny_world import make_random_model_dir
            logging.disable_progress_bar()
            self._tiny = str(make_random_model_dir(self.tmp / "tiny-gemma3"))
        return self._tiny

    def make(self, name: str):
        if name == "tiny_dir":
            return self.tiny_dir()
        if name == "buffer":
            from test_influence import make_buffer
            return make_buffer(self.tiny_dir())
        if name == "tmp_path":
            return Path(tempfile.mkdtemp(dir=self.tmp))
        raise LookupError(f"the grader has no fixture {name!r} (exercises/grade.py Fixtures)")


def cases(test) -> list[dict]:
    """The keyword arguments of each case of a (parametrized) test function."""
    axes = []
    for mark in reversed(getattr(test, "pytestmark", [])):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        values = [getattr(v, "values", v) for v in values]
        axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in values])
    return [dict(kv for part in combo for kv in part.items()) for combo in itertools.product(*axes)] or [{}]


def run_test(spec: str, fixtures: Fixtures, student_file: str, what: str) -> str | None:
    """Run one test ("tests/test_x.py::name"), every case of it; None if it passes, else the message."""
    path, name = spec.split("::")
    test = getattr(importlib.import_module(Path(path).stem), name)
    for params in cases(test):
        try:
            needed = [p for p in inspect.signature(test).parameters if p not in params]
            test(**params, **{p: fixtures.make(p) for p in needed})
        except NotImplementedError:
            return NOT_WRITTEN.format(what=what, s="" if " and " in what else "s")
        except Exception as err:   # noqa: BLE001: every failure becomes a message for the student
            return explain(err, spec, student_file)
    return None


def explain(err: Exception, spec: str, student_file: str) -> str:
    """A failed test in words: its own message, or where it failed."""
    frames = traceback.extract_tb(err.__traceback__)
    if isinstance(err, AssertionError):
        if str(err).strip():
            return " ".join(str(err).split())
        last = next((f for f in reversed(frames) if f.filename.endswith(spec.split("::")[0].split("/")[-1])), frames[-1])
        return f"a check of {spec.split('::')[1]} failed: `{(last.line or '').strip()}`"
    mine = [f for f in frames if Path(f.filename).name == Path(student_file).name and "student-" in f.filename]
    where = f" at line {mine[-1].lineno} of your {Path(student_file).name}: `{(mine[-1].line or '').strip()}`" if mine else ""
    return f"{type(err).__name__}: {' '.join(str(err).split())}{where}"


def grade_exercise(exercise: Exercise, source: str, fixtures: Fixtures, student_file: str) -> dict:
    """One exercise's verdict from the student's module source."""
    what = " and ".join(exercise.functions)
    result = {"name": exercise.name, "title": exercise.title, "file": exercise.file,
              "functions": list(exercise.functions), "checks": []}
    try:
        functions = student_code(source, exercise, student_file)
    except SyntaxError as err:
        result.update(passed=False, message=f"SyntaxError at line {err.lineno} of your {exercise.file}: {err.msg}")
        return result
    except LookupError as err:
        result.update(passed=False, message=f"cannot grade: {err}")
        return result
    for spec in exercise.tests:   # imported before the student's code is installed: each binds the project's
        importlib.import_module(Path(spec.split("::")[0]).stem)
    with installed(exercise, functions):
        for spec in exercise.tests:
            message = run_test(spec, fixtures, student_file, what)
            result["checks"].append({"test": spec, "passed": message is None, "message": message})
    failed = [c for c in result["checks"] if not c["passed"]]
    result["passed"] = not failed
    result["message"] = None if not failed else failed[0]["message"] + (
        f" ({len(failed)} of {len(result['checks'])} checks failed)" if len(failed) > 1 else "")
    return result


def grade(copy: Path, exercises: list[Exercise]) -> dict:
    """Every chosen exercise of the copy at `copy`, graded in this process."""
    fixtures, results = Fixtures(), []
    for exercise in exercises:
        path = copy / exercise.file
        results.append(grade_exercise(exercise, path.read_text(), fixtures, str(path)))
    return {"copy": str(copy), "exercises": results, "passed": sum(r["passed"] for r in results), "total": len(results)}


def words(grades: dict) -> str:
    lines = [f"[grade] {grades['copy']}"]
    for i, r in enumerate(grades["exercises"], 1):
        n = len(r["checks"])
        verdict = f"passed ({n} check{'s' if n > 1 else ''})" if r["passed"] else f"FAILED: {r['message']}"
        lines.append(f"  {i:2}. {r['name']:<18} {verdict}")
    lines.append(f"[grade] {grades['passed']} of {grades['total']} exercises passed")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("copy", type=Path, help="the student's copy (made by exercises/handout.py)")
    parser.add_argument("--exercises", help="comma-separated exercise names (default: all of them): "
                        + ", ".join(e.name for e in EXERCISES))
    parser.add_argument("--json", type=Path, default=Path("grades.json"), help="where the JSON grades go")
    args = parser.parse_args(argv)
    copy = args.copy.resolve()
    if not copy.is_dir():
        raise SystemExit(f"grade: {copy} is not a directory (give the student's copy)")
    grades = grade(copy, chosen(args.exercises))
    print(words(grades))
    args.json.write_text(json.dumps(grades, indent=2) + "\n")
    print(f"[grade] {args.json}")
    return grades


if __name__ == "__main__":
    main()
