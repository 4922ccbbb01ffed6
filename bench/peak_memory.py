"""Peak memory of one I-PPO iteration at the paper-style shape, --speedups all against on.

    HF_HUB_OFFLINE=1 python bench/peak_memory.py                  # offline Gemma-3-270M, GSM8K, CPU
    python bench/peak_memory.py --device cuda --dtype bf16        # on a GPU

One iteration of train.py, I-PPO, 16 prompts x 4 samples = 64 episodes of up to 256 new
tokens, --micro-batch-size 4, each path in a fresh process. On the CPU the figure is the
process's peak resident memory (ru_maxrss), printed next to the resident memory once the model
is loaded (the same load in a process of its own); on a GPU torch.cuda.max_memory_allocated.
--speedups all keeps the graph of every episode's scoring forward alive until the scores (its
memory grows with prompts x samples); --speedups on holds --micro-batch-size episodes' graph
at a time.

--limit-gib caps each child's address space (RLIMIT_AS, which also counts the libraries'
mappings): a path that needs more stops with an allocation error instead of waking the kernel's
OOM killer, and its row says "stopped", with the error and the peak it reached before stopping.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys, torch
sys.path.insert(0, {root!r})
import train
from model import load_policy
from offline_models import model_source
argv = json.loads(sys.argv[1])
error = None
try:
    if argv == ["--load-only"]:
        load_policy(model_source("gemma-3-270m"), device={device!r}, dtype={dtype!r}, quiet=True)
    else:
        train.main(argv)
except (MemoryError, RuntimeError) as e:     # an allocation refused under --limit-gib
    error = f"{{type(e).__name__}}: {{(str(e).splitlines() or [''])[0][:200]}}"
gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
print(json.dumps({{"rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "gpu_gib": gpu,
                  "error": error}}))
"""


def run(argv: list[str], device: str, dtype: str, limit_gib: float) -> dict:
    code = CHILD.format(root=str(ROOT), device=device, dtype=dtype)

    def cap() -> None:
        if limit_gib:
            limit = int(limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, cwd=ROOT,
                          preexec_fn=cap)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return {"rss_gib": None, "gpu_gib": None, "error": tail[0][:200]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--limit-gib", type=float, default=0.0,
                        help="cap each child's address space at this many GiB (0: no cap)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    figures = {"load only": run(["--load-only"], args.device, args.dtype, args.limit_gib)}
    with tempfile.TemporaryDirectory() as tmp:
        for passes in ("shared", "separate"):
            argv = ["--model", "gemma-3-270m", "--dataset", "gsm8k", "--data-source", "local", "--influence", "on",
                    "--iterations", "1", "--prompts-per-iter", "16", "--samples-per-prompt", "4",
                    "--max-new-tokens", "256", "--micro-batch-size", "4", "--gen-batch-size", "16",
                    "--val-batch-size", "2", "--eval-every", "0", "--no-plots", "--no-progress",
                    "--device", args.device, "--dtype", args.dtype, "--speedups", {"shared": "all", "separate": "on"}[passes],
                    "--run-dir", f"{tmp}/{passes}"]
            figures[passes] = run(argv, args.device, args.dtype, args.limit_gib)
            metrics = Path(f"{tmp}/{passes}/metrics.jsonl")
            rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
            rows = [r for r in rows if "seconds" in r]
            if rows and not figures[passes]["error"]:
                figures[passes] |= {"seconds": rows[-1]["seconds"], "response_tokens": rows[-1]["response_tokens"]}
            print(f"{passes}: {figures[passes]}", file=sys.stderr)
    print(f"{'path':<10} {'peak RSS GiB':>13} {'GPU peak GiB':>13}  note")
    for name, f in figures.items():
        rss = "-" if f["rss_gib"] is None else f"{f['rss_gib']:.2f}"
        gpu = "-" if f["gpu_gib"] is None else f"{f['gpu_gib']:.2f}"
        note = f"stopped (limit {args.limit_gib:g} GiB): {f['error']}" if f.get("error") else ""
        print(f"{name:<10} {rss:>13} {gpu:>13}  {note}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
