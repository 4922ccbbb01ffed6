"""export.py: a trained adapter in PEFT's format and as a merged model directory, each
computing the same logits as our policy with the adapter loaded."""
import json

import pytest
import torch

import evaluate
import export
import train
from model import load_adapter, load_policy
from test_train import SMALL

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread

peft = pytest.importorskip("peft", reason="peft is a test-only requirement (requirements.txt)")


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """An SFT run with a LoRA layout other than the defaults (rank 4, alpha 8, attention and
    MLP layers), two steps at a high learning rate so that every B is far from zero."""
    run_dir = tmp_path_factory.mktemp("export") / "sft"
    train.main(["--model", tiny_dir, "--run-dir", str(run_dir), *SMALL, "--algo", "sft", "--iterations", "2",
                "--eval-every", "0", "--lr", "5e-2", "--lora-rank", "4", "--lora-alpha", "8",
                "--lora-targets", "q_proj,v_proj,down_proj"])
    return run_dir


def our_logits(tiny_dir, run_dir, ids):
    policy, _ = load_policy(tiny_dir, lora_rank=4, lora_alpha=8, lora_targets=("q_proj", "v_proj", "down_proj"),
                            quiet=True)
    load_adapter(policy, run_dir / "checkpoints" / "iter_000002")
    with torch.no_grad():
        return policy.lm(input_ids=ids).logits


def test_peft_loads_the_export_and_computes_our_logits(tiny_dir, trained, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    out = export.main([str(trained), "--out", str(tmp_path / "peft")])
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["down_proj", "q_proj", "v_proj"])
    assert config["base_model_name_or_path"] == tiny_dir
    tensors = load_file(out / "adapter_model.safetensors")
    assert not any("value_head" in k for k in tensors)
    assert all(k.startswith("base_model.model.model.layers.") for k in tensors)
    assert min(t.abs().max() for k, t in tensors.items() if "lora_B" in k) > 0   # a trained B everywhere
    ids = torch.randint(4, 100, (2, 11), generator=torch.Generator().manual_seed(0))
    ours = our_logits(tiny_dir, trained, ids)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, str(out))
    with torch.no_grad():
        theirs = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            plain = peft_model(input_ids=ids).logits
    assert (ours - plain).abs().max() > 1e-3          # the adapter changes the logits ...
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)   # ... and PEFT's equal ours


def test_merged_model_loads_without_lora_code_and_evaluates(tiny_dir, trained, tmp_path):
    from transformers import AutoModelForCausalLM
    out = export.main([str(trained), "--out", str(tmp_path / "merged"), "--merge"])
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    ids = torch.randint(4, 100, (2, 11), generator=torch.Generator().manual_seed(1))
    merged = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, our_logits(tiny_dir, trained, ids), rtol=0, atol=1e-5)
    result = evaluate.main(["--model", str(out), "--dataset", "arith", "--limit", "3", "--max-new-tokens", "6",
                            "--no-progress", "--out", str(tmp_path / "eval.json")])
    assert result["n"] == 3 and result["config"]["model"] == str(out)


def test_export_refuses_a_used_directory_and_a_damaged_checkpoint(trained, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "something").write_text("x")
    with pytest.raises(SystemExit, match="not an empty directory"):
        export.main([str(trained), "--out", str(used)])
    with pytest.raises(SystemExit, match="not an empty directory"):
        export.main([str(trained), "--out", str(used / "something")])
    checkpoint = trained / "checkpoints" / "iter_000002"
    good = (checkpoint / "adapter.safetensors").read_bytes()
    try:
        (checkpoint / "adapter.safetensors").write_bytes(good[:-10])
        with pytest.raises(SystemExit, match="damaged"):
            export.main([str(trained), "--out", str(tmp_path / "x")])
        assert not (tmp_path / "x").exists()
    finally:
        (checkpoint / "adapter.safetensors").write_bytes(good)
