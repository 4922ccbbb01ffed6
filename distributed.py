"""Past one GPU: the few collective operations I-PPO needs, on torch.distributed.

Launched with `torchrun --nproc_per_node K train.py ...`, each of the K processes (ranks)
samples its share of the iteration's prompts. For the update to equal the single-process
update on the union of all ranks' episodes, every quantity that the algorithm box defines
over the whole buffer is computed over all ranks:

    whitening of advantages   mean and variance over all response tokens of all ranks
    g_val                     the validation rows are split over ranks; each rank's
                              gradient of (its NLL sum) / (token count of all ranks) is summed
    kept set and weights      scores are gathered, so keep = s > 0 and mean_{kept} s are global
    gradients                 summed over ranks before each optimizer step (all_reduce)
    metrics                   reduced before logging

Our choice: plain `all_reduce` of the gradients rather than DistributedDataParallel. The
trainable parameters (LoRA + value head) are a few MB, so there is nothing to overlap, and
an explicit sum keeps the loss normalisation visible: each rank's loss is already divided by
the size of the global minibatch, so the summed gradient is the gradient of the global loss.

Backend: nccl on CUDA GPUs, gloo on CPU, chosen automatically. Without torchrun (no
WORLD_SIZE in the environment) setup() returns Single, whose every operation is the identity,
so single-process code paths are the same code.

Public:
    setup() -> Dist or Single  initialise from torchrun's environment (or a single process)
    SINGLE                     the Single every function defaults to
    Dist.sum(t)              element-wise sum over ranks (in place, returned)
    Dist.cat(t)              1-D tensors of any length from every rank, concatenated in rank order
    Dist.offset(n)           where this rank's n items start in that concatenation
    Dist.gather_objects(xs)  lists of Python objects from every rank, concatenated in rank order
    Dist.sum_grads(params)   sum .grad over ranks
    Dist.broadcast(obj)      rank 0's Python object on every rank
    Dist.broadcast_tensors(ts)  rank 0's tensors, in place, on every rank; then checked equal
    Dist.span(n)             (start, stop) of this rank's contiguous part of n items
    Dist.mine(index, n)      which of `index` (over all ranks' items) are this rank's n
    Dist.barrier()           wait for every rank
    Dist.close()             wait for every rank, then leave the process group (end of a run)
    Dist.is_main, Dist.active   rank 0?  more than one process?
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


class Single:
    """One process: every collective is the identity, every share is the whole."""
    rank, ranks, local_rank, backend = 0, 1, 0, "none"
    is_main, active = True, False

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def offset(self, n: int) -> int:
        return 0

    def gather_objects(self, items: list) -> list:
        return items

    def sum_grads(self, params) -> None:
        pass

    def broadcast(self, obj):
        return obj

    def broadcast_tensors(self, tensors) -> None:
        pass

    def span(self, n: int) -> tuple[int, int]:
        return 0, n

    def mine(self, index: torch.Tensor, n: int) -> torch.Tensor:
        return index

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


SINGLE = Single()  # one process: every collective below is the identity


@dataclass
class Dist(Single):
    """K processes under torchrun, one per rank."""
    rank: int = 0
    ranks: int = 1
    local_rank: int = 0
    backend: str = "none"

    @property
    def is_main(self) -> bool:
        """Only rank 0 writes the run directory, checkpoints and logs."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.ranks > 1

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def cat(self, t: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return t
        sizes = [torch.zeros(1, dtype=torch.long, device=t.device) for _ in range(self.ranks)]
        dist.all_gather(sizes, torch.tensor([len(t)], device=t.device))
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros(longest, *t.shape[1:], dtype=t.dtype, device=t.device)
        padded[:len(t)] = t
        parts = [torch.empty_like(padded) for _ in range(self.ranks)]
        dist.all_gather(parts, padded)
        return torch.cat([p[:int(s.item())] for p, s in zip(parts, sizes)])

    def offset(self, n: int) -> int:
        """Where this rank's n items start in Dist.cat's concatenation."""
        if not self.active:
            return 0
        sizes = [None] * self.ranks
        dist.all_gather_object(sizes, n)
        return sum(sizes[:self.rank])

    def mine(self, index: torch.Tensor, n: int) -> torch.Tensor:
        """Of `index` (positions in Dist.cat's concatenation of every rank's items), the ones of
        this rank's n items, as positions among them."""
        first = self.offset(n)
        return index[(index >= first) & (index < first + n)] - first

    def gather_objects(self, items: list) -> list:
        """Python objects (e.g. episode records) from every rank, concatenated in rank order."""
        if not self.active:
            return items
        parts = [None] * self.ranks
        dist.all_gather_object(parts, items)
        return [x for part in parts for x in part]

    def sum_grads(self, params) -> None:
        if self.active:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def broadcast(self, obj):
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_tensors(self, tensors) -> None:
        """Copy rank 0's values into every rank's `tensors` (the trainable parameters at the start
        of a run), then check that all ranks hold the same numbers: a float64 checksum per rank,
        gathered and compared. Raises RuntimeError naming the ranks that differ."""
        if not self.active:
            return
        with torch.no_grad():
            for t in tensors:
                dist.broadcast(t.data, src=0)
            checksum = torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for t in tensors])
        sums = self.cat(checksum.flatten())
        sums = sums.view(self.ranks, -1)
        differ = [r for r in range(self.ranks) if not torch.equal(sums[r], sums[0])]
        if differ:
            raise RuntimeError(f"torchrun: ranks {differ} do not hold rank 0's trainable parameters after the broadcast")

    def span(self, n: int) -> tuple[int, int]:
        """Rank r gets items [start, stop): contiguous, sizes differ by at most one."""
        base, extra = divmod(n, self.ranks)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group before the interpreter exits, so that gloo's worker threads
        are joined while Python is alive. A worker thread still running at exit drops its last
        finished collective (which holds tensors with Python objects) during the interpreter's
        finalization; taking the GIL then ends the thread by a forced unwind through a noexcept
        destructor, and the process aborts ("terminate called without an active exception",
        SIGABRT) after a run that did everything right. destroy_process_group joins the threads
        only if nothing else holds the group: see setup() for the one holder we know of."""
        if self.active and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def setup() -> Single:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; join the process group if there is more
    than one process (Dist: nccl when CUDA is available, each rank on GPU LOCAL_RANK, else gloo).
    One process: Single."""
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks <= 1:
        return Single()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # so that device "cuda" means this rank's GPU
    if not dist.is_initialized():
        # Before the group exists: torch.distributed.fsdp (which transformers imports when a model
        # is first loaded) binds the world group as a default argument at import time
        # (ShardedGradScaler's process_group=dist.group.WORLD). Imported after
        # init_process_group, that default keeps the gloo group alive past
        # destroy_process_group, so its worker threads outlive close() and can abort the
        # interpreter's exit (see Dist.close). Imported here, it binds None.
        importlib.import_module("torch.distributed.fsdp")
        dist.init_process_group(backend=backend)
    return Dist(rank=rank, ranks=ranks, local_rank=local_rank, backend=backend)
