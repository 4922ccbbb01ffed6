"""Do two runs have the same records? metrics.jsonl and episodes.jsonl compared line by line,
the time fields aside ("seconds": how long each phase took).

    python bench/same_records.py RUN_A RUN_B [RUN_A2 RUN_B2 ...]
    python bench/same_records.py --ignore generated_tokens OLD NEW   # a field OLD's code did not log yet

A refactoring that moves code but not arithmetic must leave a run's records identical: run the
same command at the commit before and after it, on one machine, and compare. Prints, per pair,
"identical" or the first lines that differ and the keys in which they differ; exits 1 if any
pair differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIME_FIELDS = {"seconds"}


def records(run_dir: Path, name: str, ignore: frozenset = frozenset()) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line]
    return [{k: v for k, v in row.items() if k not in TIME_FIELDS | ignore} for row in rows]


def compare(a: Path, b: Path, ignore: frozenset = frozenset()) -> list[str]:
    """What differs between the two runs' records, in words (empty: identical)."""
    problems = []
    for name in ("metrics.jsonl", "episodes.jsonl"):
        rows_a, rows_b = records(a, name, ignore), records(b, name, ignore)
        if len(rows_a) != len(rows_b):
            problems.append(f"{name}: {len(rows_a)} lines against {len(rows_b)}")
        for line, (x, y) in enumerate(zip(rows_a, rows_b), 1):
            if x != y:
                keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
                problems.append(f"{name} line {line}: differs in {keys}")
                break
    return problems


def main(argv: list[str]) -> int:
    ignore = set()
    while argv[:1] == ["--ignore"] and len(argv) > 1:
        ignore.add(argv[1])
        argv = argv[2:]
    if len(argv) < 2 or len(argv) % 2:
        raise SystemExit(__doc__)
    aside = "time fields" + "".join(f", {field}" for field in sorted(ignore))
    differ = False
    for a, b in zip(argv[::2], argv[1::2]):
        problems = compare(Path(a), Path(b), frozenset(ignore))
        print(f"{a} vs {b}: " + (f"identical ({aside} aside)" if not problems else "; ".join(problems)))
        differ = differ or bool(problems)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
