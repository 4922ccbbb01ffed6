import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from tiny_world import make_random_model_dir
    return str(make_random_model_dir(tmp_path_factory.mktemp("tiny-gemma3")))


@pytest.fixture
def tiny_policy(tiny_dir):
    from model import load_policy
    return load_policy(tiny_dir, quiet=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs the real offline Gemma-3-270M (minutes on 2 CPU cores)")
