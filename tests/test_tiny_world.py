"""The tiny worlds' models: a deterministic build, the shipped tiny-arith checked at load, the
first world built once and then cached, the same token sequences as the rest of the pipeline,
and loading through load_policy like any model."""
import json

import pytest
import torch

import model
import offline_models
import tiny_world
from tasks import generate_arith, make_prompt
from rollout import encode_pairs


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py


def small_build(path, seed=0, world=tiny_world.TINY_MODEL):
    """A few steps of the real recipe (the stop rule checked once, at the last step)."""
    return tiny_world.build_tiny_arith(path, world=world, seed=seed, max_steps=3, eval_every=3, progress=False)


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


@pytest.mark.parametrize("make_tokenizer", [tiny_world.char_tokenizer, tiny_world.word_tokenizer])
def test_training_text_is_what_the_pipeline_feeds_the_model(make_tokenizer):
    tok = make_tokenizer()
    examples = generate_arith("train", terms=3)[:3]
    batch = tiny_world.sft_batch(tok, examples)
    from tasks import make_prompt
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
    monkeypatch.setattr(tiny_world, "sft_batch", lambda tok, ex, sol: seen.extend(ex) or real(tok, ex, sol))
    small_build(tmp_path / "m")
    terms = tiny_world.WORLDS[tiny_world.TINY_MODEL].terms
    holdout = {e.question for e in generate_arith("train", terms=terms)[-tiny_world.HOLDOUT_ROWS:]}
    assert seen and not holdout & {e.question for e in seen}


def test_built_once_then_loaded_from_the_cache(monkeypatch, tmp_path):
    builds = []
    real_build = tiny_world.build_tiny_arith

    def build(path, **kwargs):
        builds.append(path)
        return real_build(path, world=kwargs["world"], max_steps=3, eval_every=3, progress=False)

    monkeypatch.setattr(tiny_world, "build_tiny_arith", build)
    monkeypatch.setattr(offline_models, "CACHE_DIR", tmp_path)
    policy, tok = model.load_policy(offline_models.model_source(tiny_world.TINY_MODEL_V1), quiet=True)
    assert len(builds) == 1 and not builds[0].exists()       # built into a temporary name, then renamed
    cached = tmp_path / "tiny-arith-v1"
    assert json.loads((cached / "build.json").read_text())["version"] == 1
    assert tok.get_vocab() == tiny_world.char_tokenizer().get_vocab()
    again, _ = model.load_policy(offline_models.model_source(tiny_world.TINY_MODEL_V1), quiet=True)
    assert len(builds) == 1                                  # the second load used the cache
    saved = weights(cached)
    lm = dict(again.lm.named_parameters())
    assert torch.equal(lm["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])
    assert model.inspect_model(offline_models.model_source(tiny_world.TINY_MODEL_V1)).context == 512
    assert len(builds) == 1


def test_the_test_model_and_the_world_share_one_tokenizer_and_config(tiny_dir):
    from transformers import AutoConfig, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert tok.get_vocab() == tiny_world.char_tokenizer().get_vocab()
    config = AutoConfig.from_pretrained(tiny_dir)
    assert config.hidden_size == tiny_world.SIZES["test"]["hidden_size"]
    world = tiny_world.gemma3_config(tok, "world")
    assert world.vocab_size == config.vocab_size and world.model_type == config.model_type


def test_the_shipped_model_loads_without_a_build_and_matches_its_files(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny_world, "build_tiny_arith", lambda *a, **k: pytest.fail("tiny-arith must not be built"))
    monkeypatch.setattr(offline_models, "CACHE_DIR", tmp_path)        # an empty cache
    policy, tok = model.load_policy(offline_models.model_source(tiny_world.TINY_MODEL), quiet=True)
    assert tok.get_vocab() == tiny_world.word_tokenizer().get_vocab()
    saved = weights(tiny_world.SHIPPED_DIR)
    lm = dict(policy.lm.named_parameters())
    assert torch.equal(lm["model.embed_tokens.weight"], saved["model.embed_tokens.weight"])
    assert list(tmp_path.iterdir()) == []                     # nothing written to the cache
    record = json.loads((tiny_world.SHIPPED_DIR / "build.json").read_text())
    assert record["world"] == tiny_world.TINY_MODEL and record["terms"] == 3


@pytest.mark.parametrize("name", sorted(tiny_world.SHIPPED_SHA256))
def test_a_changed_shipped_file_is_refused(monkeypatch, tmp_path, name):
    import shutil
    copy = tmp_path / "tiny-arith-v2"
    shutil.copytree(tiny_world.SHIPPED_DIR, copy)
    assert tiny_world.check_shipped(copy) == copy
    with open(copy / name, "ab") as f:
        f.write(b" ")
    monkeypatch.setattr(tiny_world, "SHIPPED_DIR", copy)
    with pytest.raises(SystemExit, match=f"{name} has sha256"):
        model.load_policy(offline_models.model_source(tiny_world.TINY_MODEL), quiet=True)
    (copy / name).unlink()
    with pytest.raises(SystemExit, match="is missing"):
        tiny_world.check_shipped(copy)


def test_the_word_tokenizer_gives_back_any_text():
    tok = tiny_world.word_tokenizer()
    examples = generate_arith("test", terms=3)[:50]
    texts = [make_prompt(e.question, "arith") + " " + e.solution for e in examples]
    texts += ["Tom has  23 apples!\n\tZebra ~ {x} #### 5", "", "   ", "Tomato Toms"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    # one token per word and digit: "Tom" and " has" are single tokens, numbers go digit by digit
    assert tok.convert_ids_to_tokens(tok("Tom has 23", add_special_tokens=False)["input_ids"]) == ["Tom", " has", " 2", "3"]
    assert tok.convert_ids_to_tokens(tok("Tomato", add_special_tokens=False)["input_ids"]) == list("Tomato")
    char = tiny_world.char_tokenizer()
    ratio = sum(len(char(t)["input_ids"]) for t in texts[:50]) / sum(len(tok(t)["input_ids"]) for t in texts[:50])
    assert ratio > 2.5
