"""torchrun: K processes, each with its share of the episodes, make the same update as one
process with all of them (distributed.py, train.py)."""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parent / "dist_worker.py"
START_EXIT_WORKER = Path(__file__).resolve().parent / "dist_start_exit_worker.py"
GLOO = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                          reason="this torch build has no gloo backend")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(script), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def run_worker(nproc: int, model_dir: str, out: Path) -> dict:
    from safetensors.torch import load_file

    torchrun(nproc, WORKER, model_dir, str(out))
    return load_file(out)


@pytest.fixture(scope="module")
def start_exit_output(tiny_dir):
    return torchrun(2, START_EXIT_WORKER, tiny_dir).stdout


@GLOO
def test_ranks_start_from_rank_zeros_trainable_parameters(start_exit_output):
    """Each rank drew its own LoRA A (seeded by rank); after Dist.broadcast_tensors, as at the
    start of train.main, every rank holds rank 0's."""
    found = dict((r, (b, a)) for r, b, a in re.findall(r"rank (\d) parameters before (\S+) after (\S+?)(?=rank|\s|$)",
                                                       start_exit_output))
    assert sorted(found) == ["0", "1"], start_exit_output[-2000:]
    assert found["0"][0] != found["1"][0]                      # they did differ
    assert found["0"][1] == found["1"][1] == found["0"][0]     # now rank 0's everywhere


@GLOO
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from Linux's /proc")
def test_close_joins_the_gloo_threads_after_a_model_load(start_exit_output):
    """Loading a model imports torch.distributed.fsdp, whose ShardedGradScaler binds the world
    group as a default argument at import. Imported after init_process_group, that reference
    kept the gloo group, and its worker threads, alive past destroy_process_group; one of them
    then aborted the process at exit now and then (SIGABRT) after a correct run."""
    # the two ranks share stdout: their lines may run into each other
    found = re.findall(r"rank (\d) threads after close: ([\w,-]*?)(?=rank \d|\s|$)", start_exit_output)
    assert sorted(rank for rank, _ in found) == ["0", "1"], start_exit_output[-2000:]
    for rank, names in found:
        assert names and "gloo" not in names, (rank, names)


@GLOO
def test_two_gloo_processes_make_the_single_process_update(tiny_dir, tmp_path):
    one = run_worker(1, tiny_dir, tmp_path / "one.safetensors")
    two = run_worker(2, tiny_dir, tmp_path / "two.safetensors")
    # The case is not trivial: some episodes kept, some dropped, unequal weights.
    assert 0 < one["keep"].sum() < len(one["keep"])
    assert len(set(one["weights"][one["keep"].bool()].tolist())) > 1
    # The kept set and the weights are global: identical to the single process.
    assert torch.equal(one["keep"], two["keep"])
    torch.testing.assert_close(two["weights"], one["weights"], rtol=1e-5, atol=1e-6)
    # Every trainable tensor (LoRA A, B, value head) after the update, to 1e-5.
    params = [k for k in one if k not in ("keep", "weights")]
    assert params and all(k in two for k in params)
    moved = 0
    for k in params:
        torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=1e-5)
    # ... and the update did something (else equality would prove nothing).
    initial = run_initial_state(tiny_dir)
    for k in params:
        moved += int(not torch.allclose(one[k], initial[k]))
    assert moved > len(params) // 2


def run_initial_state(tiny_dir) -> dict:
    """The trainable tensors before the update, built exactly as the worker builds them."""
    from model import load_policy, lora_parameters

    torch.manual_seed(0)
    policy, _ = load_policy(tiny_dir, quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora_parameters(policy)[1::2]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return policy.trainable_state()


def test_shares_cover_every_item_once():
    from distributed import Dist

    for n in range(0, 12):
        for ranks in (1, 2, 3, 5):
            spans = [Dist(rank=r, ranks=ranks).span(n) for r in range(ranks)]
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            sizes = [b - a for a, b in spans]
            assert max(sizes) - min(sizes) <= 1
