"""Nothing lost: crashes while a checkpoint is written, NaN/inf in any phase, and degenerate
iterations, each on the tiny random Gemma-3.

Crashes are real SIGKILLs of a child process: at every filesystem step of an iteration's
commit (rundir.crash_hook names them), and at random moments. After each, the latest
checkpoint loads and --resume reproduces the uninterrupted run's metrics.jsonl and
episodes.jsonl exactly (every field but the wall-clock seconds)."""
import errno
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import rundir
import influence
import optim
import speedups
import train
from config import Config

ROOT = Path(__file__).resolve().parent.parent
# One intra-op thread (conftest.py), here and in the children, so that they compute alike.
pytestmark = pytest.mark.usefixtures("one_thread")
# Two iterations with an evaluation before the first and after the last; one checkpoint kept,
# so the second commit also deletes the first checkpoint.
ARGS = ["--iterations", "2", "--prompts-per-iter", "2", "--samples-per-prompt", "2", "--max-new-tokens", "6",
        "--val-size", "2", "--val-batch-size", "2", "--eval-every", "2", "--eval-limit", "1",
        "--eval-max-new-tokens", "2", "--truncation-penalty", "1", "--minibatch-size", "2", "--micro-batch-size", "2",
        "--keep-checkpoints", "1", "--no-progress", "--data-source", "local"]


def records(run_dir, name="metrics.jsonl"):
    return [json.loads(line) for line in (Path(run_dir) / name).read_text().splitlines()]


def without_seconds(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def assert_reproduces(run_dir, reference):
    assert without_seconds(records(run_dir)) == without_seconds(records(reference.dir))
    assert records(run_dir, "episodes.jsonl") == records(reference.dir, "episodes.jsonl")
    root = Path(run_dir) / "checkpoints"
    assert rundir.latest_checkpoint(run_dir) == root / "iter_000002"
    assert sorted(p.name for p in root.iterdir()) == ["iter_000002", "latest"]   # no leftovers, one kept


class Reference:
    """The uninterrupted run, the filesystem steps of its commits, and a copy of its run
    directory as it was right after the first commit."""


@pytest.fixture(scope="module")
def reference(tiny_dir, tmp_path_factory):
    ref = Reference()
    base = tmp_path_factory.mktemp("reference")
    ref.dir, ref.after_first_commit, ref.steps = base / "run", base / "after_first_commit", []

    def record(name):
        ref.steps.append(name)
        if name == "switched latest" and not ref.after_first_commit.exists():
            shutil.copytree(ref.dir, ref.after_first_commit)
            (ref.after_first_commit / "lock").unlink()   # the copy is not being written by this process

    rundir.crash_hook = record
    started = time.time()
    try:
        train.main(["--model", tiny_dir, "--run-dir", str(ref.dir), *ARGS])
    finally:
        rundir.crash_hook = None
    ref.seconds = time.time() - started
    rows = records(ref.dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all("policy_loss" in r for r in rows[1:]), "both iterations should update (optimizer state matters)"
    # The first commit ends when latest is switched (nothing older to delete); the second follows.
    starts = [i for i, name in enumerate(ref.steps) if name == "appended episodes.jsonl"]
    assert len(starts) == 2 and ref.steps[starts[1] - 1] == "switched latest"
    ref.first_commit, ref.second_commit = ref.steps[:starts[1]], ref.steps[starts[1]:]
    assert "renamed iter_000001 away" in ref.second_commit
    return ref


# ----------------------------------------------------------------------------- crashes

def run_until_killed(argv, kill_at_step):
    """(In a child process.) train.main(argv), SIGKILLed right after its kill_at_step-th
    filesystem step (1-based), or by the parent if kill_at_step is None."""
    torch.set_num_threads(1)
    steps = []

    def kill_at(name):
        steps.append(name)
        if len(steps) == kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    rundir.crash_hook = kill_at
    train.main(argv)


@pytest.fixture(scope="module")
def processes():
    """Children forked from a server that has imported train, torch and the parts of
    transformers a run uses (lazily imported otherwise) once: a child then runs in about a
    second instead of the ~5 s of a fresh interpreter. (A name that fails to import is skipped.)"""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["train", "transformers.models.auto.modeling_auto",
                                    "transformers.models.auto.tokenization_auto",
                                    "transformers.models.gemma3.modeling_gemma3", "safetensors.torch"])
    return context


def crash(processes, argv, kill_at_step=None, after_seconds=None):
    """train.main(argv) in a child, SIGKILLed by itself after a filesystem step or by us after
    some seconds. Returns its exit status: -9 when killed, 0 when it finished first, None when
    it hung (killed after 300 s)."""
    child = processes.Process(target=run_until_killed, args=(argv, kill_at_step))
    child.start()
    child.join(timeout=after_seconds if after_seconds is not None else 300)
    exitcode = child.exitcode
    if exitcode is None:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        exitcode = -signal.SIGKILL if after_seconds is not None else None
    child.close()
    return exitcode


def expected_latest(steps_done, reference):
    """Which checkpoint `latest` names after a crash right after step number steps_done."""
    switches = [i + 1 for i, name in enumerate(reference.steps) if name == "switched latest"]
    committed = sum(steps_done >= s for s in switches)
    return None if committed == 0 else f"iter_{committed:06d}"


def check_crashed_run(run_dir, steps_done, reference, tiny_dir):
    """After a crash: every iter_* directory is complete, `latest` names the expected one and
    it loads into a fresh policy and optimizer; then --resume reproduces the reference."""
    for ckpt in (Path(run_dir) / "checkpoints").glob("iter_*"):
        assert all((ckpt / f).is_file() for f in rundir.CHECKPOINT_FILES), ckpt
    latest = rundir.latest_checkpoint(run_dir)
    assert (latest.name if latest else None) == expected_latest(steps_done, reference)
    if latest:
        from model import load_policy
        policy, _ = load_policy(tiny_dir, quiet=True)
        optimizer = optim.make_optimizer(Config(), policy)
        assert rundir.load_checkpoint(run_dir, policy, optimizer) == int(latest.name.split("_")[1])
        assert len(optimizer.state) > 0
    train.main(["--resume", str(run_dir), "--no-progress"])
    assert_reproduces(run_dir, reference)


@pytest.mark.parametrize("commit", [1, 2])
def test_sigkill_at_every_step_of_a_commit_resumes_exactly(reference, processes, tiny_dir, tmp_path, commit):
    """Commit 1 runs from scratch; commit 2 resumes a copy of the run as it was after commit 1,
    so each child does one iteration before it is killed."""
    steps = reference.first_commit if commit == 1 else reference.second_commit
    for k, step in enumerate(steps, start=1):
        run_dir = tmp_path / f"killed_after_{k}"
        if commit == 1:
            argv = ["--model", tiny_dir, "--run-dir", str(run_dir), *ARGS]
        else:
            shutil.copytree(reference.after_first_commit, run_dir)
            argv = ["--resume", str(run_dir), "--no-progress"]
        assert crash(processes, argv, kill_at_step=k) == -signal.SIGKILL, f"the child was not killed at {step!r}"
        steps_done = k + (0 if commit == 1 else len(reference.first_commit))
        try:
            check_crashed_run(run_dir, steps_done, reference, tiny_dir)
        except AssertionError as err:
            raise AssertionError(f"after a SIGKILL right after step {k} of commit {commit} ({step!r}): {err}") from err
        shutil.rmtree(run_dir)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_a_random_moment_resumes_exactly(reference, processes, tiny_dir, tmp_path, seed):
    """Killed from outside at a random time: mid-forward, mid-write of a file, mid-append."""
    run_dir = tmp_path / "run"
    delay = random.Random(seed).uniform(0.3, 1.1) * reference.seconds
    exitcode = crash(processes, ["--model", tiny_dir, "--run-dir", str(run_dir), *ARGS], after_seconds=delay)
    assert exitcode in (0, -signal.SIGKILL)
    if not run_dir.exists():   # killed before main created it: nothing to resume, nothing lost
        return
    for ckpt in (run_dir / "checkpoints").glob("iter_*"):
        assert all((ckpt / f).is_file() for f in rundir.CHECKPOINT_FILES), ckpt
    if not (run_dir / "config.json").exists():
        return
    train.main(["--resume", str(run_dir), "--no-progress"])
    assert_reproduces(run_dir, reference)


def test_a_half_written_last_line_is_dropped_on_resume(reference, tmp_path):
    """A crash in the middle of appending iteration 2's records (after the first commit)."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference.after_first_commit, run_dir)
    for name in ("episodes.jsonl", "metrics.jsonl"):
        whole = (reference.dir / name).read_text()
        with open(run_dir / name, "a") as f:
            f.write(whole.splitlines()[-1][:40])        # no newline: cut short
    train.main(["--resume", str(run_dir), "--no-progress"])
    assert_reproduces(run_dir, reference)


def test_truncate_jsonl_keeps_committed_records_and_refuses_corrupt_ones(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 0}\n{"iteration": 1}\n\n{"iteration": 2}\n{"iteration": 3, "rew')
    rundir.truncate_jsonl(path, 1)
    assert path.read_text() == '{"iteration": 0}\n{"iteration": 1}\n'
    rundir.truncate_jsonl(path, -1)
    assert path.read_text() == ""
    path.write_text('{"iteration": 1}\nnot json\n{"iteration": 2}\n')
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2: not a JSON record"):
        rundir.truncate_jsonl(path, 5)


def test_a_crash_before_the_first_checkpoint_starts_over(reference, tmp_path):
    """Records appended, killed before any checkpoint: --resume starts from iteration 0."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference.after_first_commit, run_dir)
    shutil.rmtree(run_dir / "checkpoints")
    train.main(["--resume", str(run_dir), "--no-progress"])
    assert_reproduces(run_dir, reference)


def test_latest_naming_an_incomplete_checkpoint_is_refused(reference, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference.dir, run_dir)
    (run_dir / "checkpoints" / "iter_000002" / "optimizer.safetensors").unlink()
    with pytest.raises(SystemExit, match=r"iter_000002: damaged: optimizer\.safetensors: missing\. No older intact"):
        train.main(["--resume", str(run_dir), "--no-progress"])


# ----------------------------------------------------------------------------- NaN and inf

def corrupted(function, corrupt):
    """`function` with its result passed through `corrupt`."""
    return lambda *args, **kwargs: corrupt(function(*args, **kwargs))


def with_nan(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = float("nan")
    return t


def nan_old_logprobs(passes):
    """old_and_ref_logprobs (where pi_old comes from) leaving a NaN in them."""
    old_logprobs, values, ref_logprobs = passes
    return with_nan(old_logprobs), values, ref_logprobs


@pytest.mark.parametrize("where, name, corrupt, phase, tensor", [   # where the default path (--speedups on) calls it
    (speedups, "old_and_ref_logprobs", nan_old_logprobs, "rollout", "old_logprobs"),
    (train, "reward_fn", lambda r: float("inf"), "reward", "rewards"),
    (influence, "validation_gradient", with_nan, "influence", "g_val"),
    (speedups, "onepass_scores", with_nan, "influence", "scores"),
    (train, "policy_loss", with_nan, "update, epoch 1", "loss"),
])
def test_nan_stops_the_run_naming_the_phase_and_keeps_the_last_good_checkpoint(
        reference, tmp_path, monkeypatch, where, name, corrupt, phase, tensor):
    run_dir = tmp_path / "run"
    shutil.copytree(reference.after_first_commit, run_dir)     # iteration 1 done and committed
    patched = corrupted(getattr(where, name), corrupt)
    monkeypatch.setattr(where, name, patched)   # from iteration 2 on
    with pytest.raises(FloatingPointError) as caught:
        train.main(["--resume", str(run_dir), "--no-progress"])
    message = str(caught.value)
    assert f"iteration 2: {tensor} contains NaN/inf" in message and f"(phase: {phase})" in message
    assert "iter_000001 is the last good checkpoint" in message and f"--resume {run_dir}" in message
    # Nothing of iteration 2 was saved; iteration 1 still loads, and --resume goes on exactly.
    assert rundir.latest_checkpoint(run_dir).name == "iter_000001"
    assert [r["iteration"] for r in records(run_dir)] == [0, 1]
    monkeypatch.undo()
    train.main(["--resume", str(run_dir), "--no-progress"])
    assert_reproduces(run_dir, reference)


def test_nonfinite_gradient_stops_the_update(reference, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(reference.after_first_commit, run_dir)
    monkeypatch.setattr(train.torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: torch.tensor(float("inf")))
    with pytest.raises(FloatingPointError, match=r"iteration 2: gradient_norm contains NaN/inf .*\(phase: update\)"):
        train.main(["--resume", str(run_dir), "--no-progress"])
    assert rundir.latest_checkpoint(run_dir).name == "iter_000001"


def test_the_command_line_reports_a_nan_without_a_traceback(tiny_dir, tmp_path):
    """python train.py: exit status 1 and one message naming the phase."""
    script = ("import sys, runpy, torch, speedups\n"
              "speedups.scoring_backward = lambda *a, **k: torch.full((4,), float('nan'))\n"
              "sys.argv = ['train.py'] + sys.argv[1:]\n"
              "runpy.run_path('train.py', run_name='__main__')\n")
    argv = ["--model", tiny_dir, "--run-dir", str(tmp_path / "run"), *ARGS, "--iterations", "1", "--eval-every", "0"]
    done = subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "[error] iteration 1: scores contains NaN/inf" in done.stderr and "(phase: influence)" in done.stderr
    assert "no checkpoint had been written yet" in done.stderr


# ----------------------------------------------------------------------------- degenerate iterations

SMALL = ["--iterations", "1", "--prompts-per-iter", "2", "--samples-per-prompt", "3", "--val-size", "2",
         "--eval-every", "0", "--minibatch-size", "4", "--micro-batch-size", "2", "--no-progress",
         "--data-source", "local"]


def test_all_rewards_equal_is_logged_and_the_update_runs(tiny_dir, tmp_path, capsys):
    # The tiny model never answers correctly: with no truncation penalty every reward is 0.
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), *SMALL, "--max-new-tokens", "8",
                          "--truncation-penalty", "0", "--influence", "off"])
    row = records(run_dir)[0]
    assert row["reward"] == 0 and "rewards_equal" in row["warnings"]
    assert "policy_loss" in row and row["optimizer_steps"] > 0
    assert "all 6 rewards are 0: no reward signal" in capsys.readouterr().err
    assert rundir.latest_checkpoint(run_dir).name == "iter_000001"


def test_every_response_truncated_is_logged(tiny_dir, tmp_path, capsys):
    run_dir = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "r"), *SMALL, "--max-new-tokens", "1",
                          "--truncation-penalty", "1"])
    row = records(run_dir)[0]
    assert row["truncated"] == 1.0 and row["response_tokens"] == 1
    assert {"all_truncated", "rewards_equal"} <= set(row["warnings"])
    err = capsys.readouterr().err
    assert "every response hit --max-new-tokens 1 without EOS" in err
    assert rundir.latest_checkpoint(run_dir).name == "iter_000001"


def test_a_second_writer_is_refused_and_a_dead_ones_lock_taken_over(tiny_dir, tmp_path, capsys):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run_dir / "lock").write_text(f"{alive.pid}\n")
        with pytest.raises(SystemExit, match=rf"another process \(pid {alive.pid}\) is writing this run directory"):
            train.main(["--model", tiny_dir, "--run-dir", str(run_dir), *SMALL, "--max-new-tokens", "4"])
        assert not (run_dir / "config.json").exists()              # refused before writing anything
    finally:
        alive.kill()
        alive.wait()
    # The holder is gone now (as after a SIGKILL): its lock is taken over, and released at the end.
    train.main(["--model", tiny_dir, "--run-dir", str(run_dir), *SMALL, "--max-new-tokens", "4"])
    assert f"left by process {alive.pid}, which is no longer running; taking it over" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").exists() and not (run_dir / "lock").exists()


# ----------------------------------------------------------------------------- write errors

def test_a_full_disk_at_every_write_of_a_commit_ends_with_a_message_and_resumes_exactly(reference, tiny_dir,
                                                                                         tmp_path):
    """An OSError(ENOSPC) injected at each write of the second commit: one message (what was
    being written, the intact checkpoint, the command), then --resume reproduces the reference."""
    probe = tmp_path / "probe"
    shutil.copytree(reference.after_first_commit, probe)
    writes = []
    rundir.write_fault = writes.append
    try:
        train.main(["--resume", str(probe), "--no-progress"])
    finally:
        rundir.write_fault = None
    assert writes[:2] == ["episodes.jsonl", "metrics.jsonl"] and "checkpoints/latest" in writes
    switch = writes.index("checkpoints/latest")
    for k, what in enumerate(writes):
        run_dir = tmp_path / f"full_at_{k}"
        shutil.copytree(reference.after_first_commit, run_dir)

        def full(name, k=k):
            full.calls += 1
            if full.calls == k + 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
        full.calls = 0
        rundir.write_fault = full
        try:
            with pytest.raises(SystemExit) as ended:
                train.main(["--resume", str(run_dir), "--no-progress"])
        finally:
            rundir.write_fault = None
        message = str(ended.value)
        intact = "iter_000002" if k > switch else "iter_000001"    # the commit point is the switch of latest
        assert message.startswith(f"[error] iteration 2: writing {what} in {run_dir} failed: No space left on device")
        assert f"the last committed checkpoint, {run_dir / 'checkpoints' / intact}, is intact" in message, message
        assert message.endswith(f"continue with: python train.py --resume {run_dir}")
        train.main(["--resume", str(run_dir), "--no-progress"])
        assert_reproduces(run_dir, reference)
        shutil.rmtree(run_dir)


def test_a_full_disk_on_the_command_line_ends_without_a_traceback(reference, tiny_dir, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(reference.after_first_commit, run_dir)
    script = ("import errno, os, runpy, sys; sys.path.insert(0, '.'); import rundir\n"
              "def full(what):\n"
              "    if what == 'metrics.jsonl': raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
              "rundir.write_fault = full\n"
              "sys.argv = ['train.py'] + sys.argv[1:]\n"
              "runpy.run_path('train.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script, "--resume", str(run_dir), "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "writing metrics.jsonl" in done.stderr and "No space left on device" in done.stderr


def test_a_real_full_filesystem_ends_with_a_message_and_resumes_exactly(reference, tiny_dir, tmp_path):
    """On a small tmpfs mounted here, filled up right after the first commit: the second commit
    fails for real (ENOSPC), then --resume, with the space freed, reproduces the reference."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)],
                                                   capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a tmpfs is not permitted on this machine (the injected-ENOSPC test covers every write)")
    try:
        run_dir, filler = small / "run", small / "filler"

        def fill_the_disk(step):
            if step == "switched latest" and not filler.exists():
                fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
                try:
                    while os.write(fd, b"\0" * 4096):
                        pass
                except OSError as err:
                    assert err.errno == errno.ENOSPC
                finally:
                    os.close(fd)

        rundir.crash_hook = fill_the_disk
        try:
            with pytest.raises(SystemExit) as ended:
                train.main(["--model", tiny_dir, "--run-dir", str(run_dir), *ARGS])
        finally:
            rundir.crash_hook = None
        message = str(ended.value)
        assert message.startswith("[error] iteration 2: writing ") and "No space left on device" in message, message
        assert f"the last committed checkpoint, {run_dir / 'checkpoints' / 'iter_000001'}, is intact" in message
        filler.unlink()
        train.main(["--resume", str(run_dir), "--no-progress"])
        assert_reproduces(run_dir, reference)
    finally:   # lazy: detached even while something (a traceback's frames, say) still holds a file open there
        subprocess.run(["umount", "--lazy", str(small)], capture_output=True)
