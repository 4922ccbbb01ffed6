"""bench/reading_path.py: the line-counting rule on a hand-written module, and the tracer on a
tiny call graph. Neither runs train.main (seconds in all)."""

import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from reading_path import SourceFile, Tracer, reading_path  # noqa: E402

# Every line is marked: R a line a reader reads, - one that is not (blank, comment, docstring).
COUNTED = '''\
import os                                   # -  (module level: not in a function)


def decorate(f):                            # R
    return f                                # R


@decorate                                   # R  (the decorator is part of the function)
def outer(x):                               # R
    """A docstring,                         # -
                                            # -
    over three lines."""                    # -
    # a comment alone on its line           # -
    y = x + 1   # a trailing comment        # R

    def inner(z):                           # R  (nested: read as part of outer)
        """Inner docstring."""              # -
        return z * 2                        # R
    total = sum(inner(v)                    # R
                for v in range(y))          # R
    square = lambda v: v * v                # R
    return square(total)                    # R


def not_called():                           # R
    return os.sep                           # R
'''

GRAPH = '''\
def caller(n):
    return [callee(i) for i in range(n)]


def callee(i):
    return i + 1


def never():
    return 0
'''


def import_file(path: Path, monkeypatch):
    """The module at `path`, in sys.modules for the test (a dataclass looks its module up there)."""
    name = f"reading_path_case_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def marked(text: str, name_line: int, end_line: int) -> int:
    """The lines marked R between two lines (1-based, inclusive): the count by hand."""
    return sum(line.split("#")[-1].strip().startswith("R") for line in text.splitlines()[name_line - 1:end_line])


def test_the_counting_rule_on_a_hand_written_function(tmp_path):
    path = tmp_path / "counted.py"
    path.write_text(COUNTED)
    src = SourceFile(path)
    outer = next(n for n in src.scopes if src.qualname[n] == "outer")
    assert (src.first_line(outer), outer.end_lineno) == (8, 22)   # from the decorator
    assert src.lines(outer) == {8, 9, 14, 16, 18, 19, 20, 21, 22}
    assert marked(COUNTED, 8, 22) == 9


def test_a_nested_def_is_counted_once_in_its_parent(tmp_path, monkeypatch):
    path = tmp_path / "counted.py"
    path.write_text(COUNTED)
    module = import_file(path, monkeypatch)
    with Tracer(tmp_path) as tracer:
        assert module.outer(3) == 144
    names = {code.co_name for code in tracer.codes}
    assert {"outer", "inner", "<lambda>", "<genexpr>"} <= names   # the tracer sees them all...
    units, left_out = reading_path(tracer.codes, tracer.classes, tmp_path)
    assert [(u.name, u.lines) for u in units] == [("outer", 9)]   # ...and they are read in outer, once
    assert left_out == []


def test_the_tracer_records_what_is_called_and_nothing_else(tmp_path, monkeypatch):
    path = tmp_path / "graph.py"
    path.write_text(GRAPH)
    module = import_file(path, monkeypatch)
    module.never()   # called, but before the tracer: not on the path
    with Tracer(tmp_path) as tracer:
        assert module.caller(2) == [1, 2]
    assert {c.co_name for c in tracer.codes} == {"caller", "callee", "<listcomp>"}
    units, _ = reading_path(tracer.codes, tracer.classes, tmp_path)
    assert [(u.file, u.name, u.first, u.lines) for u in units] == [("graph.py", "caller", 1, 2),
                                                                     ("graph.py", "callee", 5, 2)]


def test_only_files_directly_in_the_root_are_the_project(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "graph.py"
    path.write_text(GRAPH)
    module = import_file(path, monkeypatch)
    with Tracer(tmp_path) as tracer:
        module.caller(1)
    assert tracer.codes == set()


def test_a_dataclass_made_on_the_path_adds_its_field_lines(tmp_path, monkeypatch):
    path = tmp_path / "shapes.py"
    path.write_text(textwrap.dedent('''\
        from dataclasses import dataclass


        @dataclass
        class Point:
            """A point."""
            x: int      # across
            y: int = 0

            def norm1(self):
                return abs(self.x) + abs(self.y)


        @dataclass
        class Unused:
            z: int = 0


        def make(x):
            return Point(x)
        '''))
    module = import_file(path, monkeypatch)
    module.Unused()   # before the tracer
    with Tracer(tmp_path) as tracer:
        module.make(2)
    assert {c.co_name for c in tracer.codes} == {"make"}   # the generated __init__ is no project file
    units, _ = reading_path(tracer.codes, tracer.classes, tmp_path)
    # @dataclass, class Point:, x, y; not norm1 (never called), not its docstring
    assert [(u.name, u.kind, u.lines) for u in units] == [("Point", "class body", 4), ("make", "function", 2)]
