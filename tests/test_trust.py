"""Trust the files: damaged checkpoints are refused with the way back, and --init-adapter is
pinned so that a resume uses exactly the policy the run started from. (Full disks and two
writers: test_faults.py.)"""
import json
import shutil
from pathlib import Path

import pytest

import evaluate
import rundir
import train

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread

SMALL = ["--prompts-per-iter", "2", "--samples-per-prompt", "2", "--max-new-tokens", "6", "--val-size", "2",
         "--val-batch-size", "2", "--eval-every", "0", "--truncation-penalty", "1", "--minibatch-size", "2",
         "--micro-batch-size", "2", "--keep-checkpoints", "2", "--no-progress", "--data-source", "local"]


def records(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def pristine(tiny_dir, tmp_path_factory):
    """A run of 3 iterations (the reference) and a copy of it after 2 (iter_000001 and iter_000002 kept)."""
    base = tmp_path_factory.mktemp("pristine")
    full = train.main(["--model", tiny_dir, "--run-dir", str(base / "full"), *SMALL, "--iterations", "3"])
    two = train.main(["--model", tiny_dir, "--run-dir", str(base / "two"), *SMALL, "--iterations", "2"])
    assert sorted(p.name for p in (two / "checkpoints").glob("iter_*")) == ["iter_000001", "iter_000002"]
    return full, two


def flip_a_byte(path: Path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "a flipped byte": flip_a_byte,
    "invalid JSON": lambda p: p.write_text("{not json"),
    "wrong types": lambda p: p.write_text(json.dumps({"iteration": "two", "config": []})),
    "deleted": lambda p: p.unlink(),
}
CASES = [("adapter.safetensors", "truncated"), ("adapter.safetensors", "a flipped byte"),
         ("optimizer.safetensors", "a flipped byte"), ("rng.safetensors", "truncated"),
         ("adapter.json", "invalid JSON"), ("optimizer.json", "invalid JSON"), ("state.json", "wrong types"),
         ("optimizer.json", "deleted"), ("checksums.json", "invalid JSON")]


@pytest.mark.parametrize("name, how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_way_back(pristine, tmp_path, name, how):
    full, two = pristine
    run_dir = tmp_path / "run"
    shutil.copytree(two, run_dir)
    damaged = run_dir / "checkpoints" / "iter_000002"
    DAMAGE[how](damaged / name)
    with pytest.raises(SystemExit) as refused:
        train.main(["--resume", str(run_dir), "--iterations", "3"])
    message = str(refused.value)
    assert message.startswith(f"{damaged}: damaged: {name}:"), message
    latest = run_dir / "checkpoints" / "latest"
    command = f"printf 'iter_000001\\n' > {latest} && python train.py --resume {run_dir}"
    assert "The newest intact checkpoint is iter_000001; to continue from it" in message and message.endswith(command)
    assert records(run_dir) == records(two)                        # nothing was changed by the refusal
    # The way back, as the message says: iteration 2 is run again, and the run ends as the reference.
    latest.write_text("iter_000001\n")
    train.main(["--resume", str(run_dir), "--iterations", "3"])
    assert records(run_dir) == records(full)


def test_the_damage_is_named_by_evaluate_and_init_adapter_too(pristine, tiny_dir, tmp_path):
    _, two = pristine
    run_dir = tmp_path / "run"
    shutil.copytree(two, run_dir)
    flip_a_byte(run_dir / "checkpoints" / "iter_000002" / "adapter.safetensors")
    with pytest.raises(SystemExit, match=r"--adapter .*damaged: adapter\.safetensors: its content changed"):
        evaluate.load_for_eval(tiny_dir, str(run_dir))
    with pytest.raises(SystemExit, match=r"--init-adapter .*damaged: adapter\.safetensors: its content changed"):
        train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "next"), *SMALL, "--iterations", "1",
                    "--init-adapter", str(run_dir)])
    assert not (tmp_path / "next").exists()                       # refused before the run directory is made


def test_init_adapter_is_pinned_so_a_resume_uses_the_policy_it_started_from(tiny_dir, tmp_path):
    sft = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "sft"), *SMALL, "--algo", "sft",
                      "--sft-batch-size", "2", "--iterations", "1", "--lr", "1e-2"])
    first = tmp_path / "sft_iter_000001"
    shutil.copytree(rundir.latest_checkpoint(sft), first)
    ppo = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "ppo"), *SMALL, "--iterations", "1",
                      "--init-adapter", str(sft)])
    pinned = ppo / "init_adapter"
    assert (pinned / "adapter.safetensors").read_bytes() == (first / "adapter.safetensors").read_bytes()
    # The SFT run moves on (its latest checkpoint is now another policy); the PPO run resumes.
    train.main(["--resume", str(sft), "--iterations", "2"])
    assert (rundir.latest_checkpoint(sft) / "adapter.safetensors").read_bytes() != pinned.joinpath(
        "adapter.safetensors").read_bytes()
    train.main(["--resume", str(ppo), "--iterations", "2"])
    reference = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "reference"), *SMALL, "--iterations", "2",
                            "--init-adapter", str(first)])
    assert records(ppo) == records(reference)                     # started from, and held to, the first SFT policy
    # A pinned copy that changed, or is gone, is refused.
    flip_a_byte(pinned / "adapter.safetensors")
    with pytest.raises(SystemExit, match=r"init_adapter: the pinned copy of --init-adapter is damaged"):
        train.main(["--resume", str(ppo), "--iterations", "3"])
    shutil.rmtree(pinned)
    with pytest.raises(SystemExit, match=r"init_adapter: missing\. It is the copy of --init-adapter"):
        train.main(["--resume", str(ppo), "--iterations", "3"])
