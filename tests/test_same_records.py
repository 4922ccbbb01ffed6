"""bench/same_records.py, the check that a refactoring moved no number: it must see a changed
value, ignore the time fields, and ignore a field only when told to."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_dir(path: Path, metrics: list[dict], episodes: list[dict]) -> Path:
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in episodes))
    return path


def same(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "same_records.py"), *map(str, argv)],
                          capture_output=True, text=True)


def test_same_records_sees_a_changed_number_and_only_the_fields_it_is_told_to_ignore(tmp_path):
    episodes = [{"iteration": 1, "response": "2 + 2 = 4", "reward": 1.0}]
    old = run_dir(tmp_path / "old", [{"iteration": 1, "loss": 0.5, "seconds": {"update": 1.0}}], episodes)
    new = run_dir(tmp_path / "new", [{"iteration": 1, "loss": 0.5, "seconds": {"update": 2.0}, "generated_tokens": 9}],
                  episodes)
    moved = run_dir(tmp_path / "moved", [{"iteration": 1, "loss": 0.5000001, "seconds": {"update": 1.0}}], episodes)
    assert same(old, old).returncode == 0
    result = same(old, new)
    assert result.returncode == 1 and "differs in ['generated_tokens']" in result.stdout
    result = same("--ignore", "generated_tokens", old, new)
    assert result.returncode == 0 and "identical (time fields, generated_tokens aside)" in result.stdout
    result = same("--ignore", "generated_tokens", old, moved)
    assert result.returncode == 1 and "differs in ['loss']" in result.stdout
