"""Each experiment's tables, regenerated from its records alone, are the ones committed beside
them (the figures are drawn by the same code from the same records; matplotlib's bytes vary
with its version, so the text is what is compared)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ROOT / "experiments"


def load(folder: str, module: str):
    sys.path.insert(0, str(EXPERIMENTS / folder))
    try:
        return __import__(module)
    finally:
        sys.path.pop(0)


def test_tiny_learns_summary_comes_from_its_records(tmp_path):
    subprocess.run([sys.executable, str(EXPERIMENTS / "tiny-learns" / "tiny_learns.py"), "--summary-only", "--records",
                    str(EXPERIMENTS / "tiny-learns" / "records.json"), "--out", str(tmp_path)], check=True,
                   capture_output=True, cwd=ROOT)
    assert (tmp_path / "summary.md").read_text() == (EXPERIMENTS / "tiny-learns" / "summary.md").read_text()
    assert (tmp_path / "learning.png").stat().st_size > 10_000


def test_filter_controls_report_comes_from_its_records():
    controls = load("filter-controls", "controls")
    assert controls.report(controls.read_records()) == (EXPERIMENTS / "filter-controls" / "report.md").read_text()


def test_val_size_report_comes_from_its_records():
    val_size = load("val-size", "val_size")
    record = val_size.read_record(val_size.RECORD)
    assert val_size.test_report(record) == val_size.REPORT.read_text()
