"""What no refactoring may change, and no CPU kind changes: the first iteration of the tiny recipe.

Before any update the policy is the shipped tiny-arith model, so the sampled responses and their
rewards are the same under PPO and I-PPO, and the same on every machine (the README's start,
0.244, is too). I-PPO's kept set is pinned as well: its smallest score is 0.9% of the largest,
far above float rounding. The digests were taken from the code before the moves of "The lesson
in one reading" (commit 4c257e5); a change that moves them changes what the project computes."""
import hashlib
import json
from pathlib import Path

import pytest

import train

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = "7b4f8017f15a7e4d07eda78267abdcc9070b10444ccc591f1c6b977cf07a9c53"   # sha256 of [[response, reward], ...]
KEPT = "00000000111111100111000011000000"                                      # I-PPO's D', episode by episode


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def first_iteration(tmp_path, influence: str) -> list[dict]:
    run = train.main([str(ROOT / "configs" / "tiny.toml"), "--influence", influence, "--iterations", "1",
                      "--eval-every", "0", "--prompts-per-iter", "8", "--no-plots", "--no-progress",
                      "--run-dir", str(tmp_path / influence)])
    return [json.loads(line) for line in (Path(run) / "episodes.jsonl").read_text().splitlines()]


def test_the_first_iteration_samples_and_keeps_what_it_always_did(tmp_path):
    """I-PPO's first iteration (PPO's samples the same episodes: the update comes after)."""
    episodes = first_iteration(tmp_path, "on")
    digest = hashlib.sha256(json.dumps([[e["response"], e["reward"]] for e in episodes]).encode()).hexdigest()
    assert len(episodes) == 32 and digest == SAMPLES
    assert "".join("1" if e["kept"] else "0" for e in episodes) == KEPT
