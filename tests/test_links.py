"""Every place a document, a recipe or a comment points to exists: the relative links of the
markdown pages (and, for `page.md#anchor`, the heading), and every path written out as
`docs/...`, `bench/...`, `experiments/...` or `configs/...` in the project's Python files
(comments and docstrings included), recipes and markdown pages."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")           # [text](target), ![alt](target)
# A path from the repository root: one of these folders, then path characters, ending in a file
# type the project writes; not part of a longer path (olympiadbench/test.jsonl is no bench/ path).
MENTION = re.compile(r"(?<![\w./-])((?:docs|bench|experiments|configs)/[\w./-]*?\.(?:md|py|jsonl|json|png|toml|sh))"
                     r"(?![\w/-]|\.\w)")
# Paths that are named on purpose without existing, each with the reason.
MISSING_ON_PURPOSE = {"configs/nope.toml": "tests/test_recipes.py: the recipe a missing file is refused as"}


def project_files() -> list[Path]:
    """The repository's files as git sees them (tracked, and new ones not ignored), that exist."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):      # not a git checkout: every file but the ignored kinds
        listed = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                  if not any(part.startswith(".") or part in ("runs", "__pycache__") for part in p.relative_to(ROOT).parts)]
    return sorted({ROOT / name for name in listed if (ROOT / name).is_file()})


def pages() -> list[Path]:
    """The markdown pages whose links are checked."""
    return [p for p in project_files() if p.suffix == ".md" and
            (p.parent == ROOT or p.parent.name == "docs" or p.relative_to(ROOT).parts[0] in ("experiments", "data"))]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    seen, out = {}, set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # https:, mailto: ...: not a file of ours
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(f"{target}: no heading #{anchor} in {path or page.name}")
    return broken


def missing_mentions(path: Path) -> list[str]:
    return sorted({m for m in MENTION.findall(path.read_text()) if not (ROOT / m).exists()
                   and m not in MISSING_ON_PURPOSE})


def test_the_checks_see_the_project():
    names = {str(p.relative_to(ROOT)) for p in pages()}
    assert {"README.md", "docs/outputs.md", "data/README.md", "experiments/fair-test/README.md"} <= names
    assert MENTION.findall("see bench/ippo_cost.py, data/olympiadbench/test.jsonl and experiments/a-b/c.json.") == \
        ["bench/ippo_cost.py", "experiments/a-b/c.json"]
    assert MENTION.findall("docs/tiny-learns.{md,png}, bench/tiny_learns.RECIPE, docs/vs-trl-*.json") == []


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("path", [p for p in project_files() if (p.suffix in (".py", ".md") or (
                                      p.suffix == ".toml" and p.parent.name == "configs")) and p != Path(__file__)],
                         ids=lambda p: str(p.relative_to(ROOT)))     # this file's examples are made up
def test_every_path_mentioned_exists(path):
    assert missing_mentions(path) == []


def test_a_broken_link_and_a_missing_path_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Its Title, here\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md) [ok](other.md#its-title-here) [ok](other.md#twice-1) [web](https://x.org/a.md)\n"
                    "[gone](gone.md) [no heading](other.md#nope) ![no figure](figure.png)\n"
                    "Run `python bench/gone.py --out docs/gone.json` and read docs/outputs.md.\n")
    assert broken_links(page) == ["gone.md: no such file", "other.md#nope: no heading #nope in other.md",
                                  "figure.png: no such file"]
    assert missing_mentions(page) == ["bench/gone.py", "docs/gone.json"]
