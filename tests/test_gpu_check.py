"""bench/gpu_check.sh --smoke: the GPU machine's one prepared command runs end to end on the CPU
(tiny model), so it is known to work before a GPU is lent."""
import json
import math
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_smoke_writes_every_figure(tmp_path):
    out = tmp_path / "gc"
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--smoke"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OUT": str(out)}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = (out / "gpu_check.md").read_text()
    rows = [json.loads(l) for l in report.splitlines() if l.startswith("{")]
    scores = [r for r in rows if "onepass_s" in r]
    memory = [r for r in rows if "memory" in r]
    assert sorted(r["dtype"] for r in scores) == ["bf16", "fp32"]
    for r in scores:
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("loop_s", "onepass_s", "fwd_bwd_s"))
        assert r["max_rel_diff"] <= 1e-3          # one-pass equals the loop, in both dtypes
    assert sorted((r["dtype"], r["lean"]) for r in memory) == [("bf16", False), ("bf16", True), ("fp32", False), ("fp32", True)]
    table = report[report.index("## 3. Seconds per phase"):]
    lines = [l for l in table.splitlines() if l.startswith("| 1 ") or l.startswith("| 2 ")]
    assert len(lines) == 2 and "rollout" in table and "influence" in table and "update" in table
    assert "Wall time of the whole check" in report
