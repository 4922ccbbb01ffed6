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


# Gemma-3's chat format, as in google/gemma-3-1b-it's template (system turns left out): a user
# turn, then the start of the model's turn; every turn ends with <end_of_turn>.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="session")
def chat_dir(tmp_path_factory):
    """A tiny random Gemma-3 whose character tokenizer has Gemma's turn tokens (special tokens,
    one id each) and chat template: the path of a chat-tuned hub model, without the hub."""
    import torch
    from transformers import Gemma3ForCausalLM

    from tiny_world import char_tokenizer, gemma3_config
    path = tmp_path_factory.mktemp("tiny-gemma3-chat")
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    torch.manual_seed(0)
    Gemma3ForCausalLM(gemma3_config(tokenizer, "test")).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module: on a shared CPU a tiny model runs much faster
    without OpenMP threads spinning for a core. A module takes it with
    pytestmark = pytest.mark.usefixtures("one_thread") (set up before its other fixtures)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_policy(tiny_dir):
    from model import load_policy
    return load_policy(tiny_dir, quiet=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs the real offline Gemma-3-270M (minutes on 2 CPU cores)")
