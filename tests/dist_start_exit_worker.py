"""Run by tests/test_distributed.py under torchrun: the start and the end of a run.

Start: each rank loads the policy with a seed of its own (so its LoRA A matrices differ), then
Dist.broadcast_tensors gives every rank rank 0's trainable tensors, as train.main does. Each
rank prints a checksum of them before and after.
End: Dist.close() leaves the process group, and each rank prints the names of its threads
still alive. No gloo worker thread may remain: one that outlives the Python code can abort the
interpreter's exit (distributed.Dist.close). Loading the model imports transformers and, through
it, torch.distributed.fsdp, which is what kept the group alive.

    torchrun --nproc_per_node 2 tests/dist_start_exit_worker.py TINY_MODEL_DIR
"""
import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from distributed import setup  # noqa: E402


def thread_names() -> list[str]:
    """Linux: the name of every thread of this process."""
    tasks = Path("/proc/self/task")
    return sorted((tasks / t / "comm").read_text().strip() for t in os.listdir(tasks))


def checksum(params) -> str:
    return f"{sum(p.double().square().sum().item() for p in params):.12e}"


if __name__ == "__main__":
    dist = setup()
    from model import load_policy
    torch.manual_seed(dist.rank)
    policy, _ = load_policy(sys.argv[1], quiet=True)
    params = [p for p in policy.parameters() if p.requires_grad]
    before = checksum(params)
    dist.broadcast_tensors(params)
    print(f"rank {dist.rank} parameters before {before} after {checksum(params)}", flush=True)
    dist.close()
    print(f"rank {dist.rank} threads after close: {','.join(thread_names())}", flush=True)
