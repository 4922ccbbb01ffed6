"""Make a student's copy of the project, with the exercises' functions blanked.

    python exercises/handout.py OUT [--exercises gae,policy_loss,...] [--no-git]

The copy holds what a student needs to run the project (the concept files, train.py and the
modules it imports, configs/, data/, docs/, the README) and none of what would give the answers
away: no tests/ (their brute-force oracles are solutions), no exercises/ (its grader and planted
mistakes), no bench/ or experiments/, no git history of this project. Each chosen function keeps
its signature and docstring; its body becomes the exercise's equation and hint as comments and a
`raise NotImplementedError`. EXERCISES.md in the copy lists the exercises and the run that shows
them working. With git installed the copy is a fresh repository with one commit, the handout.

Before it finishes, the copy is searched for every line of every removed body (lines of at least
24 characters, whitespace aside, that the blanked file does not show elsewhere); if one is found
anywhere in the copy the handout removes the copy and names the line. The instructor grades a copy with exercises/grade.py.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from catalog import EXERCISES, STUDENT_RUN, Exercise, chosen  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LEFT_OUT = ("tests/", "exercises/", "bench/", "experiments/", ".ci/", ".github/", "pytest.ini", ".gitignore")
MIN_LEAK = 24   # characters: shorter lines ("rows = []", "return advantages") say nothing of an answer


def project_files(root: Path = ROOT) -> list[str]:
    """The project's files as git tracks them (or, without git, every file but caches and runs),
    less what a student's copy leaves out."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                 and not any(part in ("__pycache__", ".git", "runs") for part in p.relative_to(root).parts)]
    return sorted(f for f in files if not f.startswith(LEFT_OUT))


def function_node(tree: ast.Module, qualified: str) -> ast.FunctionDef:
    """The def of "name" or "Class.method" in a module's syntax tree."""
    scope, node = tree.body, None
    for part in qualified.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise SystemExit(f"exercises: no {qualified} in the module (catalog.py names it)")
        scope = node.body
    return node


def body_lines(node: ast.FunctionDef) -> tuple[int, int]:
    """The 1-based line range of a function's body after its docstring (what the student writes)."""
    first = node.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    start = node.body[1].lineno if has_doc and len(node.body) > 1 else first.end_lineno + 1 if has_doc else first.lineno
    return start, node.end_lineno


def blank(source: str, exercise: Exercise) -> tuple[str, list[str]]:
    """The module's source with the exercise's functions blanked, and the removed lines."""
    lines, removed = source.splitlines(keepends=True), []
    tree = ast.parse(source)
    nodes = sorted((function_node(tree, f) for f in exercise.functions), key=lambda n: n.lineno, reverse=True)
    for node in nodes:   # bottom up, so that earlier line numbers stay valid
        start, end = body_lines(node)
        indent = " " * (node.col_offset + 4)
        wrap = lambda text, first, then: [f"{indent}{line}\n" for line in textwrap.wrap(   # noqa: E731
            text, 100 - len(indent), initial_indent=first, subsequent_indent=then)]
        stub = [f"{indent}# Exercise {exercise.name}: {exercise.title}\n", *wrap(exercise.equation, "#   ", "#   "),
                *wrap(exercise.hint, "# Hint: ", "#       "),
                f'{indent}raise NotImplementedError("exercise {exercise.name}: write {node.name} (EXERCISES.md)")\n']
        removed += lines[start - 1:end]
        lines[start - 1:end] = stub
    return "".join(lines), removed


def normal(line: str) -> str:
    return " ".join(line.split())


def leaks(copy: Path, removed: list[str]) -> list[tuple[str, str]]:
    """(line, file) for every removed line of at least MIN_LEAK characters found in the copy."""
    wanted = {normal(line) for line in removed}
    wanted = {w for w in wanted if len(w) >= MIN_LEAK and not w.startswith("#")}
    found = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file() and ".git" not in p.relative_to(copy).parts):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        present = {normal(line) for line in text.splitlines()}
        found += [(w, str(path.relative_to(copy))) for w in sorted(wanted & present)]
    return found


def exercises_md(exercises: list[Exercise]) -> str:
    rows = "\n".join(f"| {i} | `{e.name}` | {e.title} | `{e.file}`: {', '.join(f'`{f}`' for f in e.functions)} |"
                     for i, e in enumerate(exercises, 1))
    details = "\n\n".join(f"### {i}. {e.title} (`{e.name}`)\n\n`{e.file}`: {', '.join(f'`{f}`' for f in e.functions)}"
                          f"\n\n    {e.equation}\n\nHint: {e.hint}." for i, e in enumerate(exercises, 1))
    return f"""# Exercises

This copy of the project has {len(exercises)} functions left for you to write. Each keeps its
signature and its docstring, which says what it must compute; in its body you find the equation,
a hint and a `raise NotImplementedError`. Replace that line with your code.

| # | exercise | what | where |
|---|---|---|---|
{rows}

Your instructor grades your copy with the project's own tests, the ones it runs on itself, and
tells you per exercise whether it passed or what went wrong.

When all of them are written, this run uses every one but GRPO's (which `--advantage grpo` uses):
I-PPO with the per-episode gradient loop and a KL penalty, 50 iterations on the tiny world
(about 10 minutes on a 2-core CPU):

    {STUDENT_RUN}

Its greedy accuracy on the 500 test problems starts at 0.244; with correct exercises it gains at
least 8 points by iteration 50 (the project's own runs gained 9.8 to 14.8 points at seeds 0-2):
`runs/exercises/plots.png`, or `tensorboard --logdir runs`.

{details}
"""


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the student's copy (a new directory)")
    parser.add_argument("--exercises", help="comma-separated exercise names (default: all of them): "
                        + ", ".join(e.name for e in EXERCISES))
    parser.add_argument("--no-git", action="store_true", help="do not make the copy a git repository")
    args = parser.parse_args(argv)
    exercises = chosen(args.exercises)
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"handout: {out} exists and is not empty; give a new directory")
    for name in project_files():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, out / name)
    removed = []
    for exercise in exercises:
        path = out / exercise.file
        text, lines = blank(path.read_text(), exercise)
        path.write_text(text)
        removed.append((path, lines))
    # a removed line that the blanked file still shows elsewhere (a neighbour's "params = ...") is no answer
    removed = [line for path, lines in removed for line in lines
               if normal(line) not in {normal(kept) for kept in path.read_text().splitlines()}]
    (out / "EXERCISES.md").write_text(exercises_md(exercises))
    readme = out / "README.md"
    if readme.exists():   # the copy has no tests/: its README's test command would fail
        readme.write_text("> **A student's copy, with exercises.** Start with [EXERCISES.md](EXERCISES.md). The tests "
                          "are not part of it: your instructor grades your copy.\n\n" + readme.read_text())
    found = leaks(out, removed)
    if found:
        shutil.rmtree(out)
        raise SystemExit("handout: the copy would carry a solution, so it was removed:\n"
                         + "\n".join(f"  {file}: {line}" for line, file in found))
    if not args.no_git and shutil.which("git"):
        env = {**os.environ, "GIT_AUTHOR_NAME": "handout", "GIT_AUTHOR_EMAIL": "handout@localhost",
               "GIT_COMMITTER_NAME": "handout", "GIT_COMMITTER_EMAIL": "handout@localhost"}
        for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "The handout"]):
            subprocess.run(command, cwd=out, check=True, env=env)
    print(f"[handout] {out}: {len(exercises)} exercises ({', '.join(e.name for e in exercises)}); "
          f"the student starts with EXERCISES.md")
    return out


if __name__ == "__main__":
    main()
