"""Run by tests/test_distributed.py under torchrun: join the process group, load a model (which
imports transformers and, through it, torch.distributed.fsdp), leave the group, then print the
names of the threads still alive. After Dist.close() no gloo worker thread may remain: one that
outlives the Python code can abort the interpreter's exit (distributed.Dist.close).

    torchrun --nproc_per_node 2 tests/dist_exit_worker.py TINY_MODEL_DIR
"""
import os
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from distributed import setup  # noqa: E402


def thread_names() -> list[str]:
    """Linux: the name of every thread of this process."""
    tasks = Path("/proc/self/task")
    return sorted((tasks / t / "comm").read_text().strip() for t in os.listdir(tasks))


if __name__ == "__main__":
    dist = setup()
    from model import load_policy
    load_policy(sys.argv[1], quiet=True)
    dist.close()
    print(f"rank {dist.rank} threads after close: {','.join(thread_names())}", flush=True)
