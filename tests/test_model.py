"""LoRA layers, the reference policy as adapters-off, adapter save/load."""
import pytest
import torch

from model import (LoRALinear, adapters_disabled, load_adapter, load_policy, load_reference_adapter, lora_parameters,
                   save_adapter)
from rollout import encode_prompts


def test_lora_linear_math():
    torch.manual_seed(0)
    base = torch.nn.Linear(5, 3)
    layer = LoRALinear(base, rank=2, alpha=4.0)
    x = torch.randn(7, 5)
    assert torch.allclose(layer(x), base(x)), "a fresh adapter (B = 0) must leave the layer equal to the base layer"
    with torch.no_grad():
        layer.lora_B.normal_()
    expected = x @ base.weight.T + base.bias + 2.0 * x @ layer.lora_A.T @ layer.lora_B.T
    got = layer(x)
    assert got.shape == expected.shape, f"LoRA forward: output shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    assert not torch.allclose(got, x @ base.weight.T + base.bias + x @ layer.lora_A.T @ layer.lora_B.T), (
        "the adapter's update must be scaled by alpha / rank (self.scale, 2 here): y = W0 x + b0 + (alpha / rank) B A x")
    assert torch.allclose(got, expected, atol=1e-5), "LoRA forward must be y = W0 x + b0 + (alpha / rank) B (A x)"
    layer.enabled = False
    assert torch.allclose(layer(x), base(x)), (
        "with the adapters disabled (the reference policy, model.adapters_disabled) and no reference adapter, the "
        "layer must be the base layer: use ref_A and ref_B, or nothing when they are None, while enabled is False")
    assert not base.weight.requires_grad and layer.lora_A.requires_grad


def test_fresh_adapters_equal_base_model(tiny_dir):
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager")
    policy, tok = load_policy(tiny_dir, quiet=True)
    ids, mask = encode_prompts(tok, ["Question: 2+2?", "Hi"])
    with torch.no_grad():
        logits, _ = policy(ids, mask, n_last=ids.shape[1])
        ref = base(input_ids=ids, attention_mask=mask,
                   position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    torch.testing.assert_close(logits, ref)


def test_adapters_off_is_the_base_model_after_training(tiny_dir):
    policy, tok = load_policy(tiny_dir, quiet=True)
    ids, mask = encode_prompts(tok, ["Question: 2+2?", "Hi"])
    with torch.no_grad():
        before, _ = policy(ids, mask, n_last=3)
    optimizer = torch.optim.SGD(lora_parameters(policy), lr=1.0)
    for _ in range(3):
        logits, _ = policy(ids, mask, n_last=3)
        optimizer.zero_grad()
        logits.logsumexp(-1).mean().neg().backward()
        optimizer.step()
    with torch.no_grad():
        after, _ = policy(ids, mask, n_last=3)
        with adapters_disabled(policy):
            reference, _ = policy(ids, mask, n_last=3)
        again, _ = policy(ids, mask, n_last=3)
    assert (after - before).abs().max() > 1e-3             # training changed the policy
    torch.testing.assert_close(reference, before)          # adapters off: the base model
    torch.testing.assert_close(again, after)               # and the context restores them


def test_reference_adapter_is_the_starting_policy(tiny_dir, tmp_path):
    policy, tok = load_policy(tiny_dir, quiet=True)
    ids, mask = encode_prompts(tok, ["Question: 2+2?", "Hi"])
    with torch.no_grad():
        base, _ = policy(ids, mask, n_last=3)
        for p in lora_parameters(policy):
            p.add_(torch.randn_like(p) * 0.05)          # an "SFT" adapter
        sft, _ = policy(ids, mask, n_last=3)
    save_adapter(policy, tmp_path, {"rank": 8})
    load_reference_adapter(policy, tmp_path)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.add_(torch.randn_like(p) * 0.05)          # training moves on from it
        moved, _ = policy(ids, mask, n_last=3)
        with adapters_disabled(policy):
            reference, _ = policy(ids, mask, n_last=3)
    assert (sft - base).abs().max() > 1e-3 and (moved - sft).abs().max() > 1e-3
    torch.testing.assert_close(reference, sft)             # the reference is the SFT policy, not the base
    fresh, _ = load_policy(tiny_dir, lora_rank=4, quiet=True)
    with pytest.raises(SystemExit, match="no LoRA tensors"):
        load_reference_adapter(fresh, tmp_path)


def test_unknown_lora_target_is_refused(tiny_dir):
    with pytest.raises(ValueError, match="--lora-targets: no nn.Linear named \\['qq_proj'\\]"):
        load_policy(tiny_dir, lora_targets=("q_proj", "qq_proj"), quiet=True)


def test_adapter_round_trip(tiny_dir, tmp_path):
    policy, _ = load_policy(tiny_dir, quiet=True)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.normal_()
        policy.value_head.weight.normal_()
    save_adapter(policy, tmp_path / "ckpt", {"rank": 8})
    other, _ = load_policy(tiny_dir, quiet=True)
    load_adapter(other, tmp_path / "ckpt")
    for (n, a), b in zip(policy.trainable_state().items(), other.trainable_state().values()):
        assert torch.equal(a, b), n
    wrong, _ = load_policy(tiny_dir, lora_rank=4, quiet=True)
    with pytest.raises(SystemExit, match="do not fit this model's LoRA layout"):
        load_adapter(wrong, tmp_path / "ckpt")


def test_unreachable_hub_id_names_the_offline_default():
    with pytest.raises(SystemExit, match="--model gemma-3-270m"):
        load_policy("no-such-org/no-such-model", quiet=True)


def test_the_default_model_is_the_offline_default():
    """config.py names the default --model as a string (it stands below offline_models.py):
    the two must agree."""
    import offline_models
    from config import Config
    assert Config().model == offline_models.OFFLINE_DEFAULT
