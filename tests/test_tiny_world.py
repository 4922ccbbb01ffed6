"""The tiny world's model: a deterministic build, a cache that is reused, the same token
sequences as the rest of the pipeline, and loading through load_policy like any model."""
import json

import pytest
import torch

import model
import tiny_world
from data import generate_arith
from rollout import encode_pairs


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_build(path, seed=0):
    """A few steps of the real recipe (the stop rule checked once, at the last step)."""
    return tiny_world.build_tiny_arith(path, seed=seed, max_steps=3, eval_every=3, progress=False)


def weights(path):
    from safetensors.torch import load_file
    return load_file(path / "model.safetensors")


def test_build_is_deterministic(tmp_path):
    record = small_build(tmp_path / "a")
    small_build(tmp_path / "b")
    small_build(tmp_path / "c", seed=1)
    a, b, c = weights(tmp_path / "a"), weights(tmp_path / "b"), weights(tmp_path / "c")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)       # the seed matters
    assert record["steps"] == 3 and record["checks"][0]["step"] == 3
    assert 0.5e6 < record["parameters"] < 5e6
    assert json.loads((tmp_path / "a" / "build.json").read_text()) == record


def test_training_text_is_what_the_pipeline_feeds_the_model():
    tok = tiny_world.char_tokenizer()
    examples = generate_arith("train")[:3]
    batch = tiny_world.sft_batch(tok, examples)
    from data import make_prompt
    seqs = encode_pairs(tok, [make_prompt(e.question, "arith") for e in examples], [e.solution for e in examples])
    for i in range(3):
        ours = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        theirs = seqs.input_ids[i][seqs.attention_mask[i].bool()].tolist()
        assert ours == theirs
        # the loss covers the solution and its EOS: the response tokens of encode_pairs
        labelled = batch["labels"][i][batch["labels"][i] != -100].tolist()
        assert labelled == seqs.response_ids[i][seqs.response_mask[i].bool()].tolist()


def test_the_holdout_rows_are_not_trained_on(monkeypatch, tmp_path):
    seen = []
    real = tiny_world.sft_batch
    monkeypatch.setattr(tiny_world, "sft_batch", lambda tok, ex: seen.extend(ex) or real(tok, ex))
    small_build(tmp_path / "m")
    holdout = {e.question for e in generate_arith("train")[-tiny_world.HOLDOUT_ROWS:]}
    assert seen and not holdout & {e.question for e in seen}


def test_built_once_then_loaded_from_the_cache(monkeypatch, tmp_path):
    builds = []
    real_build = tiny_world.build_tiny_arith

    def build(path, **kwargs):
        builds.append(path)
        return real_build(path, max_steps=3, eval_every=3, progress=False)

    monkeypatch.setattr(tiny_world, "build_tiny_arith", build)
    monkeypatch.setattr(model, "CACHE_DIR", tmp_path)
    policy, tok = model.load_policy(tiny_world.TINY_MODEL, quiet=True)
    assert len(builds) == 1 and not builds[0].exists()       # built into a temporary name, then renamed
    cached = tmp_path / f"{tiny_world.TINY_MODEL}-v{tiny_world.BUILD_VERSION}"
    assert (cached / "build.json").exists()
    again, _ = model.load_policy(tiny_world.TINY_MODEL, quiet=True)
    assert len(builds) == 1                                  # the second load used the cache
    saved = weights(cached)
    lm = dict(again.lm.named_parameters())
    assert torch.equal(lm["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])
    assert model.inspect_model(tiny_world.TINY_MODEL).context == 512
    assert len(builds) == 1


def test_the_test_model_and_the_world_share_one_tokenizer_and_config(tiny_dir):
    from transformers import AutoConfig, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert tok.get_vocab() == tiny_world.char_tokenizer().get_vocab()
    config = AutoConfig.from_pretrained(tiny_dir)
    assert config.hidden_size == tiny_world.SIZES["test"]["hidden_size"]
    world = tiny_world.gemma3_config(tok, "world")
    assert world.vocab_size == config.vocab_size and world.model_type == config.model_type
