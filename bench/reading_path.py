"""How many lines a student reads to follow one I-PPO iteration: measured by tracing it.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python bench/reading_path.py                 # the plain path
    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python bench/reading_path.py -- --influence on   # the defaults
    HF_HUB_OFFLINE=1 python bench/reading_path.py --json path.json -- --influence on --speedups off

The project's goal: a student who follows one I-PPO iteration reads at most 500 lines. This
script runs ONE iteration through the project's own entry point, train.main(argv), on a tiny
random Gemma-3 (tiny_world.make_random_model_dir) with a few prompts and short responses, no
evaluation, and records which of the project's functions run. Everything after `--` goes to
train.main unchanged and chooses the path. Without `--`: I-PPO with the speed-ups off,
`--influence on --speedups off` where train.main's --help lists --speedups, else the flags
that chose the plain path before that switch, `--influence on --influence-method loop`
(`--passes separate` was their default, and config.py refused it next to the loop). The
record comes from the trace alone: no file or function name of the project is written
here, except the entry point train.main and the wrapped train.ppo_iteration.

What is recorded (Tracer):
  - The tracer (sys.setprofile, 'call' events) is on only while train.ppo_iteration runs:
    loading the model, the setup in main and main's own loop are not counted.
    train.ppo_iteration is replaced, for the run, by a wrapper that switches the tracer on
    and off around it; main must call it through that module attribute, once.
  - It sees this thread only. The run is on the CPU (--device cpu, before the flags after
    `--`), where autograd runs every backward, custom autograd Functions' included, in the
    calling thread.
  - A function of the project is a code object whose file is a .py file directly in the
    repository root (not tests/, bench/, experiments/, not site-packages).
  - A class of the project is used on the path when one of its methods runs (above), or when
    code generated at run time (a file named like "<string>": a dataclass's __init__, __eq__,
    __repr__, a NamedTuple's __new__) runs with an instance of it, or the class itself, as
    its first argument: creating a dataclass instance is seen this way. Its project base
    classes are used too (their fields make up the instance). A class that has no Python
    code run on the path (no method of its own, no generated one) is not seen, nor one whose
    instances were made before the iteration and are only read in it (the config): reading
    an attribute is no call.

How a recorded function is read (SourceFile, reading_path):
  - Its lines are the lines of its `def` (or lambda) node in the file's ast, from the first
    decorator to end_lineno, less blank lines, comment-only lines and the lines of every
    docstring inside it (a trailing comment does not make a line blank). A line counts once
    however many tokens it has; a multi-line expression is read line by line.
  - A function, lambda or class written inside another recorded function is part of it:
    counted once, in the outermost recorded function around it, even if the tracer recorded
    it too. One that is recorded while no function around it is (a lambda made in main and
    called in the iteration) counts on its own, its own lines only.
  - A comprehension or generator expression (its own code object in Python 3.11) is read as
    part of the function it is written in: that function is counted.
  - Module-level code and class bodies run at import time are setup, not the iteration: they
    are left out (a module first imported inside the iteration is listed on stderr).
  - A class used on the path adds its own body lines: the decorators and `class` line, field
    definitions, class constants, less every function or class defined in it (methods count
    as functions, only if recorded), blank lines, comments and docstrings.
  - Every line is counted once in the total: the units above do not overlap; any line two
    units would share goes to the first in file and line order.

Prints one line per file (lines read, functions, class bodies), then every function and
class body sorted by file and line with its count, then the total. `--json PATH` writes the
same as JSON. The exit status is 0 whatever the total.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import sys
import tempfile
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The plain path, I-PPO with every speed-up off: train.py's one switch where its --help has it, else
# the per-episode loop (the flags before --speedups; --passes separate was their default).
PLAIN_PATH = ["--influence", "on", "--speedups", "off"]
PLAIN_PATH_BEFORE = ["--influence", "on", "--influence-method", "loop"]
# One iteration, seconds on a CPU: tests/test_train.py's SMALL setting, no evaluation, no plots. On
# the CPU: a GPU's autograd runs backward in a thread of its own, where the tracer does not look.
TINY_RUN = ["--device", "cpu", "--iterations", "1", "--prompts-per-iter", "2", "--samples-per-prompt", "3",
            "--max-new-tokens", "8", "--val-size", "4", "--eval-limit", "3", "--eval-max-new-tokens", "6",
            "--truncation-penalty", "1", "--minibatch-size", "4", "--micro-batch-size", "2", "--data-source", "local",
            "--eval-every", "0", "--no-progress", "--no-plots"]
GOAL = 500
FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
NOT_READ = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}


# ----------------------------------------------------------------------------- the tracer

class Tracer:
    """Records, while it is entered, the project's code objects that are called (`codes`) and
    the project classes that generated code ran with (`classes`: (file, qualname) pairs).
    The project is the .py files directly in `root`."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.codes: set = set()
        self.classes: set[tuple[str, str]] = set()
        self._kinds: dict[str, str] = {}   # co_filename -> "project", "generated" or "other"
        self._before = None

    def __enter__(self) -> Tracer:
        self._before = sys.getprofile()
        sys.setprofile(self._on_event)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._before)

    def project_file(self, filename: str | None) -> str | None:
        """The resolved path of `filename` if it is a project file, else None."""
        if not filename or filename.startswith("<"):
            return None
        path = Path(filename).resolve()
        return str(path) if path.suffix == ".py" and path.parent == self.root else None

    def _kind(self, filename: str) -> str:
        if filename not in self._kinds:
            self._kinds[filename] = ("generated" if filename.startswith("<") else
                                     "project" if self.project_file(filename) else "other")
        return self._kinds[filename]

    def _on_event(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        kind = self._kind(code.co_filename)
        if kind == "project":
            self.codes.add(code)
        elif kind == "generated" and code.co_argcount + code.co_kwonlyargcount > 0:
            first = frame.f_locals.get(code.co_varnames[0])
            for cls in (first if isinstance(first, type) else type(first)).__mro__:
                path = self.project_file(getattr(sys.modules.get(cls.__module__), "__file__", None))
                if path:
                    self.classes.add((path, cls.__qualname__))


# ----------------------------------------------------------------------------- reading a file

class SourceFile:
    """One project file as a reader sees it: the lines that hold code (`read`: not blank, not
    comment-only, not in a docstring) and its function, lambda and class nodes, each with
    its parent node (`parent`) and qualified name (`qualname`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        source = self.path.read_text()
        self.tree = ast.parse(source, str(self.path))
        code_lines = set()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in NOT_READ:
                code_lines.update(range(tok.start[0], tok.end[0] + 1))   # a multi-line string: every line
        docstrings = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)):
                    docstrings.update(range(first.lineno, first.end_lineno + 1))
        self.read = code_lines - docstrings
        self.parent: dict = {}
        self.qualname: dict = {}
        self.scopes: list = []   # every function, lambda and class node
        self._name_scopes(self.tree, None, "")

    def _name_scopes(self, node, scope, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, SCOPE_NODES):
                name = "<lambda>" if isinstance(child, ast.Lambda) else child.name
                self.parent[child], self.qualname[child] = scope, prefix + name
                self.scopes.append(child)
                inner = prefix + name + ("." if isinstance(child, ast.ClassDef) else ".<locals>.")
                self._name_scopes(child, child, inner)
            else:
                self._name_scopes(child, scope, prefix)

    @staticmethod
    def first_line(node) -> int:
        return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

    def span(self, node) -> set[int]:
        return set(range(self.first_line(node), node.end_lineno + 1))

    def lines(self, node) -> set[int]:
        """The lines a reader reads for `node`: a function or lambda, all of it; a class, its own
        body without the functions and classes defined in it."""
        lines = self.span(node) & self.read
        if isinstance(node, ast.ClassDef):
            for inner in self.scopes:
                if not isinstance(inner, ast.Lambda) and self.inside(inner, node):   # a lambda in a field is read
                    lines -= self.span(inner)
        return lines

    def inside(self, node, outer) -> bool:
        """Whether `node` is written inside `outer` (at any depth)."""
        node = self.parent[node]
        while node is not None:
            if node is outer:
                return True
            node = self.parent[node]
        return False

    def node_for(self, code):
        """The function or lambda node a reader reads for a code object: its own, or for a
        comprehension or generator expression the function it is written in. None for code
        that is no function (a module or class body run at import, a comprehension at
        module level)."""
        line, name = code.co_firstlineno, code.co_name
        for node in self.scopes:
            if isinstance(node, FUNCTION_NODES) and self.qualname[node].rsplit(".", 1)[-1] == name \
                    and line in (node.lineno, self.first_line(node)):
                return node
        if name.startswith("<") and name != "<module>":   # <listcomp>, <genexpr>, ...: the function around it
            around = [n for n in self.scopes if isinstance(n, FUNCTION_NODES) and line in self.span(n)]
            return max(around, key=self.first_line) if around else None
        return None

    def class_node(self, qualname: str):
        return next((n for n in self.scopes if isinstance(n, ast.ClassDef) and self.qualname[n] == qualname), None)


# ----------------------------------------------------------------------------- the reading path

@dataclass
class Unit:
    """A function or class body on the reading path, and the lines read for it."""
    file: str          # relative to the repository root
    name: str          # qualified name (Policy.forward, main.<locals>.<lambda>)
    kind: str          # "function" or "class body"
    first: int         # first line (the first decorator's)
    last: int
    lines: int         # lines read


def reading_path(codes, classes, root: Path = ROOT) -> tuple[list[Unit], list[str]]:
    """The units a reader reads for the recorded `codes` and `classes` (Tracer), sorted by file
    and line, and the recorded code left out (module or class bodies run at import)."""
    root = Path(root).resolve()
    files: dict[str, SourceFile] = {}
    nodes: dict[str, set] = {}   # file -> the function, lambda and class nodes read
    left_out = []

    def source(path: str) -> SourceFile:
        if path not in files:
            files[path], nodes[path] = SourceFile(path), set()
        return files[path]

    for code in codes:
        path = str(Path(code.co_filename).resolve())
        node = source(path).node_for(code)
        if node is None:
            left_out.append(f"{Path(path).relative_to(root)}:{code.co_firstlineno} {code.co_name}")
            continue
        nodes[path].add(node)
        scope = files[path].parent[node]
        while scope is not None:   # a method's class (and any class around that) is used
            if isinstance(scope, ast.ClassDef):
                nodes[path].add(scope)
            scope = files[path].parent[scope]
    for path, qualname in classes:
        node = source(path).class_node(qualname)
        if node is not None:
            nodes[path].add(node)

    units, seen = [], set()
    for path in sorted(nodes):
        src = files[path]
        read = [n for n in nodes[path]   # the outermost: nothing recorded around them is a function
                if not any(isinstance(o, FUNCTION_NODES) and src.inside(n, o) for o in nodes[path])]
        for node in sorted(read, key=src.first_line):
            lines = {(path, line) for line in src.lines(node)} - seen
            seen |= lines
            units.append(Unit(str(Path(path).relative_to(root)), src.qualname[node],
                              "class body" if isinstance(node, ast.ClassDef) else "function",
                              src.first_line(node), node.end_lineno, len(lines)))
    return units, sorted(left_out)


# ----------------------------------------------------------------------------- one iteration

def plain_path() -> list[str]:
    """PLAIN_PATH if train.main's --help lists --speedups, else PLAIN_PATH_BEFORE."""
    sys.path.insert(0, str(ROOT))
    import train
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        train.main(["--help"])
    return PLAIN_PATH if "--speedups" in help_text.getvalue() else PLAIN_PATH_BEFORE


def trace_one_iteration(train_flags: list[str]) -> Tracer:
    """Runs train.main on a tiny random model for one iteration, `train_flags` last, with the
    tracer on inside train.ppo_iteration only. train's own output goes to stderr."""
    sys.path.insert(0, str(ROOT))
    import train
    from tiny_world import make_random_model_dir

    tracer = Tracer(ROOT)
    iteration, calls = train.ppo_iteration, []

    def traced_iteration(*args, **kwargs):
        with tracer:
            out = iteration(*args, **kwargs)
        calls.append(out)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        model = make_random_model_dir(Path(tmp) / "model")
        argv = ["--model", str(model), "--run-dir", str(Path(tmp) / "run"), *TINY_RUN, *train_flags]
        train.ppo_iteration = traced_iteration
        try:
            with contextlib.redirect_stdout(sys.stderr):
                train.main(argv)
        finally:
            train.ppo_iteration = iteration
    if len(calls) != 1:
        raise SystemExit(f"train.main called train.ppo_iteration {len(calls)} times through the module attribute, "
                         "not once: nothing to measure (do these flags run PPO, one iteration?)")
    metrics = calls[0][0] if isinstance(calls[0], tuple) and isinstance(calls[0][0], dict) else {}
    if metrics.get("kept_fraction", 1.0) == 0:
        print("[warning] the filter kept no episode: the update did not run, and is not on the path measured",
              file=sys.stderr)
    return tracer


def report(units: list[Unit], train_flags: list[str]) -> dict:
    """The report as a dict (what --json writes): per file, per unit, the total."""
    per_file: dict[str, dict] = {}
    for u in units:
        f = per_file.setdefault(u.file, {"lines": 0, "functions": 0, "class_bodies": 0})
        f["lines"] += u.lines
        f["functions" if u.kind == "function" else "class_bodies"] += 1
    return {"entry": "train.main -> train.ppo_iteration (one iteration, traced)", "train_flags": train_flags,
            "files": per_file, "units": [asdict(u) for u in units], "total": sum(u.lines for u in units),
            "goal": GOAL}


def print_report(out: dict) -> None:
    """report()'s dict as text: per file, then per unit by file and line, then the total."""
    print(f"reading path of one iteration, train.py flags: {' '.join(out['train_flags'])}")
    width = max([len(f) for f in out["files"]] + [4])
    for file, f in out["files"].items():
        print(f"  {file:<{width}} {f['lines']:5d} lines  {f['functions']:3d} functions  "
              f"{f['class_bodies']} class bodies")
    print("functions and class bodies, by file and line:")
    for u in out["units"]:
        where = f"{u['file']}:{u['first']}-{u['last']}"
        kind = "" if u["kind"] == "function" else f" ({u['kind']})"
        print(f"  {where:<{width + 10}} {u['lines']:4d}  {u['name']}{kind}")
    n_functions = sum(f["functions"] for f in out["files"].values())
    n_classes = sum(f["class_bodies"] for f in out["files"].values())
    print(f"total: {out['total']} lines in {n_functions} functions and {n_classes} class bodies "
          f"(goal: at most {out['goal']})")


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    own, train_flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, None)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="%(prog)s [--json PATH] [-- TRAIN_FLAGS...]")
    parser.add_argument("--json", default=None, help="write the report as JSON here too")
    args = parser.parse_args(own)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    torch.set_num_threads(1)
    train_flags = plain_path() if train_flags is None else train_flags
    tracer = trace_one_iteration(train_flags)
    units, left_out = reading_path(tracer.codes, tracer.classes)
    for code in left_out:
        print(f"[left out] {code} (module or class body run at import)", file=sys.stderr)
    out = report(units, train_flags)
    print_report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
