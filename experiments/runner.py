"""Running an experiment's train.py jobs: `parallel` processes of one thread each, resumable.

A job is a dict: "name", "run_dir", "argv" (train.py's flags, without --iterations and
--run-dir) and "iterations"; optionally "after", the name of a job it waits for. A finished
run is left as it is, a started one resumes (compare.train_command), and a failed one is
reported while the others go on. The experiments under experiments/ share this loop, and
machine() and code_version(), which every record names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from compare import finished, train_command  # noqa: E402


def run_all(jobs: list[dict], parallel: int, deadline: float, tag: str, done=finished, on_finish=None) -> list[str]:
    """Run the jobs not `done` (default: their run directory holds the last iteration), none
    started after `deadline` (time.time()); `on_finish(job)` is called for every job done,
    before or now. Returns the names of the jobs that failed."""
    finished_names = {j["name"] for j in jobs if done(j)}
    for j in jobs:
        if on_finish and j["name"] in finished_names and (j["run_dir"] / "metrics.jsonl").exists():
            on_finish(j)
    pending, running, failed = [j for j in jobs if j["name"] not in finished_names], [], []
    print(f"[{tag}] {len(finished_names)} of {len(jobs)} runs done before", file=sys.stderr)
    while running or (pending and time.time() < deadline):
        ready = [j for j in pending if not j.get("after") or j["after"] in finished_names]
        while ready and len(running) < parallel and time.time() < deadline:
            j = ready.pop(0)
            pending.remove(j)
            j["run_dir"].parent.mkdir(parents=True, exist_ok=True)
            argv = train_command(j, progress=False)
            print(f"[{tag}] {time.strftime('%H:%M')} {j['name']}: train.py {' '.join(argv)}", file=sys.stderr, flush=True)
            log = open(f"{j['run_dir']}.log", "a")
            proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *argv], cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
            running.append((j, proc, log))
        time.sleep(1.0)
        for item in list(running):
            j, proc, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            if proc.returncode == 0 and done(j):
                finished_names.add(j["name"])
                if on_finish:
                    on_finish(j)
            else:
                failed.append(j["name"])
                print(f"[{tag}] {j['name']} failed (exit {proc.returncode}); see {j['run_dir']}.log", file=sys.stderr)
    if pending:
        print(f"[{tag}] {len(pending)} runs not started; run again to go on", file=sys.stderr)
    return failed


def machine() -> str:
    """The CPU model and core count, as each record names its machine."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        name = "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def code_version() -> str:
    """The short commit hash of the checkout the runs come from."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
