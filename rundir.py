"""The run directory: crash-safe commits of each iteration, checkpoints, resume.

A run directory holds config.json, data.json, metrics.jsonl, episodes.jsonl and checkpoints/,
and tensorboard/ (every metric as TensorBoard event files, written after each commit when the
optional tensorboard package is installed: `tensorboard --logdir runs` shows the curves live).
commit_iteration writes an iteration in this order:
  1. its records are appended to episodes.jsonl and metrics.jsonl, and fsynced;
  2. its checkpoint is written into checkpoints/.tmp_iter_N, every file fsynced;
  3. that directory is renamed to checkpoints/iter_N (atomic) and checkpoints/ is fsynced;
  4. checkpoints/latest is replaced (latest.tmp, fsync, rename: atomic) to name iter_N;
  5. checkpoints older than the newest --keep-checkpoints are renamed away, then deleted.
Step 4 is the commit point. A crash (SIGKILL, power loss) before it leaves the previous
checkpoint as `latest`, and --resume drops the records of step 1 (a half-written last line
included); a crash after it leaves the new one. Every iter_* directory is complete: one
appears and disappears only by a rename. Either way the resumed run continues exactly.

Checkpoints hold safetensors and JSON only (no pickle): the LoRA adapters and value head, the
optimizer state, the RNG state and the iteration. A checkpoint directory, or a run directory
(its latest checkpoint), is what --init-adapter and evaluate.py --adapter take.

Public:
    open_run(cfg, dist) -> (run_dir, the pinned --init-adapter or None)   what train.main opens
    open_run_dir(cfg) -> Path            create (or reopen with --resume), lock, write config.json
    lock_run_dir(run_dir), unlock_run_dir(run_dir)   one writing process per run directory
    commit_iteration(run_dir, it, cfg, metrics, episodes, policy, optimizer) -> checkpoint
    record_start(run_dir, cfg, metrics)  the evaluation before the first iteration, as row 0
    board_scalars(run_dir, step, metrics)   the iteration's numbers into tensorboard/ (if installed)
    restore_run(run_dir, keep, policy, optimizer) -> completed iterations (--resume)
    latest_checkpoint(run_dir), resolve_checkpoint(path, flag), load_checkpoint(run_dir, ...)
    checkpoint_problems(dir) -> ["file: what is wrong"], from checksums.json (written last)
    pin_init_adapter(run_dir, source) -> the run's own checked copy of --init-adapter
    write_atomic(path, text), append_jsonl(path, records), truncate_jsonl(path, last_iteration)
    last_good_checkpoint_on_fault(run_dir)   context: a NaN/inf names the checkpoint to resume
    crash_hook, write_fault              tests set them to crash between two filesystem steps of a
                                         commit, or to fail a write (a full disk)
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from config import Config
from distributed import SINGLE, Single
from model import load_adapter, save_adapter


CHECKPOINT_FILES = ("adapter.safetensors", "adapter.json", "optimizer.safetensors", "optimizer.json",
                    "rng.safetensors", "state.json")
# Written last into every checkpoint (and the pinned --init-adapter copy): the size and sha256
# of each of its other files, checked whenever the checkpoint is loaded.
CHECKSUMS = "checksums.json"


# Tests set this to a function of the step's name (one that SIGKILLs the process at the k-th
# step, say) to check that a crash between any two filesystem steps of a commit leaves a run
# that resumes exactly. None in normal use.
crash_hook = None


# Tests set this to a function of what is about to be written that raises an OSError (ENOSPC,
# say), to check that a failed write ends the run with a message and that --resume continues
# exactly. None in normal use.
write_fault = None


class WriteFailed(Exception):
    """A write of one step of a commit failed; `what` was being written, `reason` says why."""
    def __init__(self, what: str, err: Exception):
        super().__init__(what)
        self.what, self.reason = what, getattr(err, "strerror", None) or str(err)


@contextmanager
def writing(what: str):
    """One write of a commit: an OSError in it (or safetensors' own error for one, which is
    what a full disk gives while a tensor file is written) becomes WriteFailed(what)."""
    from safetensors import SafetensorError

    try:
        if write_fault is not None:
            write_fault(what)
        yield
    except (OSError, SafetensorError) as err:
        raise WriteFailed(what, err) from err


def fs_step(name: str) -> None:
    """A point between two filesystem steps of commit_iteration (see crash_hook)."""
    if crash_hook is not None:
        crash_hook(name)


def fsync_path(path: Path) -> None:
    """Flush a file, or a directory's list of names (so that a rename in it survives power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text`: a crash leaves the old content or the new, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def append_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())  # on disk before the checkpoint that covers these records


def truncate_jsonl(path: Path, last_iteration: int) -> None:
    """Keep the records of iterations <= last_iteration: later ones were appended after the
    checkpoint we resume from, by a run that crashed before committing them. Text after the
    last newline is a write that such a crash cut short, dropped too. A line before it that is
    not JSON was not written by a crash: the resume stops there, naming it."""
    if not path.exists():
        return
    complete, _, torn = path.read_bytes().rpartition(b"\n")
    if torn:
        print(f"[resume] {path}: dropping a half-written last line ({len(torn)} bytes)", file=sys.stderr)
    kept = []
    for line_no, line in enumerate(complete.split(b"\n") if complete else [], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise SystemExit(f"{path}:{line_no}: not a JSON record ({err}); fix or remove that line") from err
        if record.get("iteration", 0) <= last_iteration:
            kept.append(line.decode() + "\n")
    write_atomic(path, "".join(kept))


def lora_settings(cfg: Config) -> dict:
    return {"model": cfg.model, "targets": cfg.targets(), "rank": cfg.lora_rank, "alpha": cfg.lora_alpha}


def save_optimizer(optimizer, directory: Path) -> None:
    """AdamW state: its tensors as safetensors, its hyper-parameters as JSON (no pickle)."""
    from safetensors.torch import save_file

    state = optimizer.state_dict()
    tensors = {f"{index}.{name}": value for index, per_param in state["state"].items()
               for name, value in per_param.items()}
    not_tensors = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
    if not_tensors:
        raise TypeError(f"optimizer state {not_tensors[:3]} is not a tensor: save_optimizer stores tensors only")
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "optimizer.safetensors")
    (directory / "optimizer.json").write_text(json.dumps({"param_groups": state["param_groups"]}, indent=2))


def load_optimizer(optimizer, directory: Path) -> None:
    from safetensors.torch import load_file

    state = {}
    for key, value in load_file(directory / "optimizer.safetensors").items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = json.loads((directory / "optimizer.json").read_text())["param_groups"]
    for group in groups:  # JSON turned tuples such as betas into lists
        group.update({k: tuple(v) for k, v in group.items() if isinstance(v, list) and k != "params"})
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def discard(directory: Path) -> None:
    """Remove a directory by renaming it away first, so no iter_* directory is ever partial."""
    trash = directory.with_name(".trash_" + directory.name)
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(directory, trash)
    fs_step(f"renamed {directory.name} away")
    shutil.rmtree(trash)
    fs_step(f"deleted {directory.name}")


def save_checkpoint(run_dir: Path, iteration: int, cfg: Config, policy, optimizer, selection: dict | None = None) -> Path:
    """checkpoints/iter_NNNNNN/: adapter and value head, optimizer state, RNG state (safetensors)
    and the iteration with the selection rule's state (JSON: selection.py), committed by
    switching checkpoints/latest (steps 2-5 above)."""
    from safetensors.torch import save_file

    root = run_dir / "checkpoints"
    final, tmp = root / f"iter_{iteration:06d}", root / f".tmp_iter_{iteration:06d}"
    with writing("checkpoints/ (removing what an earlier crash left)"):
        tidy_checkpoints(root, cfg.keep_checkpoints)
    with writing(f"checkpoints/{tmp.name}/adapter.safetensors and adapter.json"):
        tmp.mkdir(parents=True)
        save_adapter(policy, tmp, lora_settings(cfg))
    fs_step("wrote adapter")
    with writing(f"checkpoints/{tmp.name}/optimizer.safetensors and optimizer.json"):
        save_optimizer(optimizer, tmp)
    fs_step("wrote optimizer")
    with writing(f"checkpoints/{tmp.name}/rng.safetensors"):
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        save_file(rng, tmp / "rng.safetensors")
    fs_step("wrote rng")
    with writing(f"checkpoints/{tmp.name}/state.json and {CHECKSUMS}"):
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "config": dataclasses.asdict(cfg),
                                                    "selection": selection or {}}, indent=2))
        write_checksums(tmp)
        for f in [*tmp.iterdir(), tmp]:
            fsync_path(f)
    fs_step("wrote state.json")
    with writing(f"checkpoints/{final.name} (renaming {tmp.name})"):
        if final.exists():  # written by a run that crashed before `latest` named it: never committed
            discard(final)
        os.replace(tmp, final)
        fsync_path(root)
        fsync_path(run_dir)  # checkpoints/ itself is new at the first commit
    fs_step(f"renamed to {final.name}")
    with writing("checkpoints/latest"):
        write_atomic(root / "latest", final.name + "\n")
    fs_step("switched latest")
    with writing("checkpoints/ (removing checkpoints older than --keep-checkpoints)"):
        tidy_checkpoints(root, cfg.keep_checkpoints)
    return final


def tidy_checkpoints(root: Path, keep: int) -> None:
    """Remove what a crash or a commit leaves behind: unfinished .tmp_ and .trash_ directories,
    checkpoints after `latest` (written, never committed) and all but the newest `keep` up to it."""
    for leftover in [*root.glob(".tmp_iter_*"), *root.glob(".trash_*")]:
        shutil.rmtree(leftover)
    latest = latest_checkpoint(root.parent)
    if latest is None:
        return
    newest_first = sorted(root.glob("iter_*"), reverse=True)   # zero-padded names sort by iteration
    committed = [p for p in newest_first if p.name <= latest.name]
    for old in [p for p in newest_first if p.name > latest.name] + committed[keep:]:
        discard(old)


def commit_iteration(run_dir: Path, it: int, cfg: Config, metrics: dict, episodes: list, policy, optimizer,
                     selection: dict | None = None) -> Path:
    """Log iteration `it`, then checkpoint it, in the order described above. A write that fails
    (a full disk, say) ends the run with one message: what was being written, the last
    committed checkpoint (intact: the commit point was not reached, or was and names the new
    one) and the command that continues the run once the cause is fixed."""
    try:
        with writing("episodes.jsonl"):
            append_jsonl(run_dir / "episodes.jsonl", episodes)
        fs_step("appended episodes.jsonl")
        with writing("metrics.jsonl"):
            append_jsonl(run_dir / "metrics.jsonl", [{"iteration": it + 1, **metrics}])
        fs_step("appended metrics.jsonl")
        checkpoint = save_checkpoint(run_dir, it + 1, cfg, policy, optimizer, selection)
    except WriteFailed as failed:
        latest = latest_checkpoint(run_dir)
        committed = (f"the last committed checkpoint, {latest}, is intact" if latest else
                     "no checkpoint had been committed yet (--resume starts the run over)")
        raise SystemExit(f"[error] iteration {it + 1}: writing {failed.what} in {run_dir} failed: {failed.reason}. "
                         f"Nothing is lost: {committed}. Once the cause is fixed (free disk space, say), continue "
                         f"with: python train.py --resume {run_dir}") from None
    if cfg.tensorboard:
        board_scalars(run_dir, it + 1, metrics)
    return checkpoint


def record_start(run_dir: Path, cfg: Config, metrics: dict) -> None:
    """The evaluation before the first iteration: metrics.jsonl's row 0 (and TensorBoard's step 0)."""
    append_jsonl(run_dir / "metrics.jsonl", [{"iteration": 0, **metrics}])
    if cfg.tensorboard:
        board_scalars(run_dir, 0, metrics)


_boards: dict = {}   # run directory -> its SummaryWriter (None: tensorboard is not installed)


def board_scalars(run_dir: Path, step: int, metrics: dict) -> None:
    """Every number of an iteration's metrics (nested ones as "seconds/rollout") as TensorBoard
    scalars at `step`, in run_dir/tensorboard/, flushed at once so that the curves are live. The
    first write of a process purges the events from `step` on, which a crashed attempt left
    (resumed runs log each step once). Optional: without the tensorboard package nothing is
    written, and a failed write only warns: the records above are the run's own."""
    key = str(Path(run_dir).resolve())
    if key not in _boards:
        try:
            from torch.utils.tensorboard import SummaryWriter
            _boards[key] = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=step)
        except ImportError:
            _boards[key] = None
    board = _boards[key]
    if board is None:
        return
    try:
        for name, value in metrics.items():
            for tag, number in (value.items() if isinstance(value, dict) else [("", value)]):
                if isinstance(number, (int, float)) and not isinstance(number, bool):
                    board.add_scalar(f"{name}/{tag}" if tag else name, number, step)
        board.flush()
    except OSError as err:
        print(f"[tensorboard] warning: could not write {run_dir}/tensorboard: {err}", file=sys.stderr)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint checkpoints/latest names, or None before the first commit."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    ckpt = pointer.parent / pointer.read_text().strip()
    if any(not (ckpt / f).is_file() for f in CHECKPOINT_FILES):
        refuse_damaged(Path(run_dir), ckpt)
    return ckpt


def resolve_checkpoint(path: str, flag: str = "") -> Path:
    """A checkpoint directory, or a run directory (its latest checkpoint). `flag` names the
    command-line flag that gave `path`, for the error message."""
    p, where = Path(path), f"{flag} {path}".strip()
    if (p / "checkpoints").is_dir():
        p = latest_checkpoint(p)
        if p is None:
            raise SystemExit(f"{where}: a run directory without a complete checkpoint yet")
    elif not (p / "adapter.safetensors").exists():
        raise SystemExit(f"{where}: neither a checkpoint directory nor a run directory with checkpoints")
    problems = checkpoint_problems(p, required=("adapter.safetensors", "adapter.json"))
    if problems:
        raise SystemExit(f"{where}: the checkpoint {p} is damaged: {'; '.join(problems)}")
    return p


def selection_state(run_dir: Path) -> dict:
    """The selection rule's state as the latest checkpoint holds it ({} before the first, or for
    a checkpoint written before rules had state)."""
    ckpt = latest_checkpoint(run_dir)
    return json.loads((ckpt / "state.json").read_text()).get("selection", {}) if ckpt else {}


def load_checkpoint(run_dir: Path, policy, optimizer) -> int:
    """Restore adapters, value head, optimizer and RNG; returns the completed iteration count."""
    from safetensors.torch import load_file

    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise SystemExit(f"{run_dir}: a run directory without a complete checkpoint yet")
    if checkpoint_problems(ckpt):
        refuse_damaged(Path(run_dir), ckpt)
    load_adapter(policy, ckpt)
    load_optimizer(optimizer, ckpt)
    rng = load_file(ckpt / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((ckpt / "state.json").read_text())["iteration"]


def file_digest(path: Path) -> dict:
    """{"bytes", "sha256"} of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def write_checksums(directory: Path) -> None:
    """checksums.json: the digest of every other file in `directory`."""
    sums = {f.name: file_digest(f) for f in sorted(directory.iterdir()) if f.is_file() and f.name != CHECKSUMS}
    (directory / CHECKSUMS).write_text(json.dumps(sums, indent=2))


def checkpoint_problems(directory: Path, required=CHECKPOINT_FILES) -> list[str]:
    """What is wrong with a checkpoint's files, as "file: what" ([] when intact): a required
    file missing, or a file whose size or sha256 is not the one checksums.json recorded when it
    was written (truncated, altered, bit rot). A checkpoint written before checksums existed
    (no checksums.json) is checked for its files only."""
    problems = [f"{name}: missing" for name in required if not (directory / name).is_file()]
    path = directory / CHECKSUMS
    if not path.exists():
        return problems
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        recorded = None
    if not (isinstance(recorded, dict) and all(isinstance(v, dict) and isinstance(v.get("bytes"), int)
                                               and isinstance(v.get("sha256"), str) for v in recorded.values())):
        return problems + [f"{CHECKSUMS}: damaged (not the record this code writes)"]
    for name, want in recorded.items():
        if not (directory / name).is_file():
            problems += [] if name in required else [f"{name}: missing"]
            continue
        got = file_digest(directory / name)
        if got["bytes"] != want["bytes"]:
            problems.append(f"{name}: {got['bytes']} bytes, but {want['bytes']} when it was written (truncated?)")
        elif got["sha256"] != want["sha256"]:
            problems.append(f"{name}: its content changed since it was written (sha256 differs)")
    return problems


def refuse_damaged(run_dir: Path, ckpt: Path) -> None:
    """Stop a resume from a damaged checkpoint: name each damaged file and the newest intact
    older checkpoint, with the command that continues from it (nothing goes back silently)."""
    problems = checkpoint_problems(ckpt)
    older = [p for p in sorted((run_dir / "checkpoints").glob("iter_*"), reverse=True)
             if p.name < ckpt.name and not checkpoint_problems(p)]
    if older:
        fallback = (f"The newest intact checkpoint is {older[0].name}; to continue from it (the iterations after "
                    f"it are run again, their records dropped): printf '{older[0].name}\\n' > "
                    f"{run_dir / 'checkpoints' / 'latest'} && python train.py --resume {run_dir}")
    else:
        fallback = "No older intact checkpoint is left (see --keep-checkpoints); the run must start over."
    raise SystemExit(f"{ckpt}: damaged: {'; '.join(problems)}. {fallback}")


def pin_init_adapter(run_dir: Path, source: Path | None) -> Path:
    """--init-adapter is the run's initial and KL-reference policy, so it is pinned: a start
    from scratch copies the checkpoint's adapter.safetensors and adapter.json, with their
    checksums, into run_dir/init_adapter/, and every later start (--resume) uses that copy,
    checked, whatever has happened to the source since (an SFT run extended, retrained or
    deleted). source: the resolved --init-adapter checkpoint when the run starts from scratch,
    None on a resume. A resume whose copy is gone or altered is refused."""
    pinned = run_dir / "init_adapter"
    if source is not None:
        tmp = run_dir / "init_adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in ("adapter.safetensors", "adapter.json"):
            shutil.copyfile(source / name, tmp / name)
        write_checksums(tmp)
        for f in [*tmp.iterdir(), tmp]:
            fsync_path(f)
        shutil.rmtree(pinned, ignore_errors=True)
        os.replace(tmp, pinned)
        fsync_path(run_dir)
    if not (pinned / CHECKSUMS).exists():
        raise SystemExit(f"{pinned}: missing. It is the copy of --init-adapter this run started from (its initial "
                         "and KL-reference policy), so the run cannot go on as it began; restore it or start a new run")
    problems = checkpoint_problems(pinned, required=("adapter.safetensors", "adapter.json"))
    if problems:
        raise SystemExit(f"{pinned}: the pinned copy of --init-adapter is damaged: {'; '.join(problems)}; restore "
                         "it or start a new run")
    return pinned


def restore_run(run_dir: Path, keep: int, policy, optimizer, writer: bool = True) -> int:
    """--resume: load the latest checkpoint, drop the log records written after it and what a
    crash left in checkpoints/. A run that crashed before its first checkpoint starts over
    (its first evaluation included). Returns the number of completed iterations. Under
    torchrun every rank loads; only the writer (rank 0) tidies the run directory."""
    if latest_checkpoint(run_dir) is None:
        start, keep_through = 0, -1
        message = f"[resume] {run_dir}: no checkpoint yet, starting from iteration 0"
    else:
        start = keep_through = load_checkpoint(run_dir, policy, optimizer)
        message = f"[resume] {run_dir}: continuing after iteration {start}"
    if writer:
        print(message, file=sys.stderr)
        if start:
            tidy_checkpoints(run_dir / "checkpoints", keep)
        for name in ("metrics.jsonl", "episodes.jsonl"):
            truncate_jsonl(run_dir / name, keep_through)
    return start


def open_run(cfg: Config, dist: Single = SINGLE) -> tuple[Path, Path | None]:
    """The run directory (new, or --resume's) and the run's pinned copy of --init-adapter (None
    without one). A resume uses that copy, not the source, unless nothing was committed yet
    (then the run starts over, from the source)."""
    from_scratch = not (cfg.resume and latest_checkpoint(Path(cfg.resume)) is not None)
    source = resolve_checkpoint(cfg.init_adapter, "--init-adapter") if cfg.init_adapter and from_scratch else None
    run_dir = Path(dist.broadcast(str(open_run_dir(cfg)) if dist.is_main else None))
    if not cfg.init_adapter:
        return run_dir, None
    if dist.is_main:
        pin_init_adapter(run_dir, source)
    dist.barrier()
    return run_dir, run_dir / "init_adapter"


def open_run_dir(cfg: Config) -> Path:
    """Create (or, with --resume, reopen) the run directory, take its lock (lock_run_dir) and
    write config.json."""
    run_dir = Path(cfg.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.algo}"
                   f"{'' if cfg.algo == 'sft' else ('-influence' if cfg.influence == 'on' else '-plain')}")
    if run_dir.exists() and not run_dir.is_dir():
        raise SystemExit(f"--run-dir {run_dir}: exists and is not a directory")
    if not cfg.resume and ((run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists()):
        raise SystemExit(f"--run-dir {run_dir}: already holds a run; use --resume {run_dir} or another directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    write_atomic(run_dir / "config.json", json.dumps(dataclasses.asdict(cfg), indent=2))
    return run_dir


def lock_run_dir(run_dir: Path) -> None:
    """One writer per run directory: run_dir/lock holds the writing process's pid, created
    atomically (O_EXCL). A second train.py on the same run (a requeued job while the first is
    still alive, say) is refused, naming the first one's pid; a lock whose process is gone (a
    crash, a SIGKILL) is taken over with a message. unlock_run_dir, or the process's exit,
    removes it. (A pid reused by an unrelated process would read as alive: then remove the
    lock file by hand, as the message says.)"""
    path = run_dir / "lock"
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            holder = _lock_holder(path)
            if holder == os.getpid():      # this process holds it already (an earlier main() that raised)
                return
            if holder is not None and _alive(holder):
                raise SystemExit(f"{run_dir}: another process (pid {holder}) is writing this run directory; "
                                 f"wait for it to end or stop it (if pid {holder} is not a train.py, remove "
                                 f"{path})") from None
            print(f"[lock] {path}: left by process {holder}, which is no longer running; taking it over",
                  file=sys.stderr)
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        atexit.register(unlock_run_dir, run_dir)
        return


def unlock_run_dir(run_dir: Path) -> None:
    """Remove the lock if this process holds it."""
    path = run_dir / "lock"
    if _lock_holder(path) == os.getpid():
        path.unlink(missing_ok=True)


def _lock_holder(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):      # gone, or written half by a process killed in between
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)                # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:            # it exists, under another user
        return True
    return True


@contextmanager
def last_good_checkpoint_on_fault(run_dir: Path):
    """A NaN/inf (FloatingPointError) stops the run before anything of its iteration is saved;
    add where the last good checkpoint is and how to continue from it."""
    try:
        yield
    except FloatingPointError as err:
        latest = latest_checkpoint(run_dir)
        kept = f"{latest} is the last good checkpoint" if latest else "no checkpoint had been written yet"
        raise FloatingPointError(f"{err}. Nothing of that iteration was saved; {kept}; "
                                 f"--resume {run_dir} continues from it") from err
