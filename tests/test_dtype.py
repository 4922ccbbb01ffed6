"""The GPU's dtype path on the CPU: --dtype bf16 loads the base weights in bfloat16, as a GPU
run does, while LoRA, the value head, log-probs and losses stay fp32. Every phase runs and
stays finite, and the one-pass influence scores still equal the loop's."""
import json
import math
from pathlib import Path

import pytest
import torch

import evaluate
import train
from influence import episode_gradients, influence_scores, validation_gradient
from speedups import onepass_scores
from model import LoRALinear, load_policy, lora_parameters, pick_device_and_dtype
from rollout import encode_pairs
from test_influence import TEMPERATURE, make_buffer
from test_train import SMALL, metrics

pytestmark = pytest.mark.usefixtures("one_thread")   # conftest.py: one intra-op thread


def test_dtype_flag_picks_the_base_weights_dtype_only(tiny_dir):
    assert pick_device_and_dtype("cpu", "auto")[1] == torch.float32
    assert pick_device_and_dtype("cpu", "bf16")[1] == torch.bfloat16
    assert pick_device_and_dtype("cpu", "fp32")[1] == torch.float32
    with pytest.raises(SystemExit, match="--dtype"):
        pick_device_and_dtype("cpu", "fp16")
    policy, _ = load_policy(tiny_dir, dtype="bf16", quiet=True)
    assert policy.dtype == torch.bfloat16
    lora = [m for m in policy.modules() if isinstance(m, LoRALinear)]
    assert lora and all(m.base.weight.dtype == torch.bfloat16 for m in lora)
    assert all(p.dtype == torch.float32 for p in lora_parameters(policy))
    assert policy.value_head.weight.dtype == torch.float32
    assert policy.lm.get_output_embeddings().weight.dtype == torch.bfloat16


def scores_for(tiny_dir, dtype, rollouts=None):
    """Loop and one-pass scores of test_influence's 6-episode buffer in `dtype`."""
    policy, tok, rollouts, advantages = make_buffer(tiny_dir, dtype, rollouts)
    for t in (rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs):
        assert t.dtype == torch.float32 and torch.isfinite(t).all()
    val = encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?"], ["#### 4", "10 - 3 = 7\n#### 7"])
    g_val = validation_gradient(policy, val)
    loop = influence_scores(episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE), g_val)
    onepass = {b: onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=TEMPERATURE, batch_size=b)
               for b in (6, 4, 1)}
    return rollouts, loop, onepass


def test_onepass_equals_loop_in_bf16_and_bf16_is_close_to_fp32(tiny_dir):
    """Tolerances. One-pass and the loop see the same bf16 activations (the base model's
    forward is the same computation either way); they differ only in how fp32 products are
    summed and how rows are blocked, so they must agree far better than one bf16 rounding step
    (2^-8 = 3.9e-3 relative): we ask for 1e-3 of the largest |score| (measured: 9e-8).
    bf16 against fp32 is a different question: every activation is rounded to 8 bits of
    mantissa, so scores move by a few percent (measured: 3.5% of the largest |score| on this
    buffer); we ask for 10%, and the same sign for every score above 10% of the largest."""
    rollouts, loop32, _ = scores_for(tiny_dir, "fp32")
    _, loop16, onepass16 = scores_for(tiny_dir, "bf16", rollouts)
    assert torch.isfinite(loop16).all() and loop16.abs().min() > 0
    for batch_size, scores in onepass16.items():
        assert ((scores - loop16).abs().max() / loop16.abs().max()).item() <= 1e-3, batch_size
    assert ((loop16 - loop32).abs().max() / loop32.abs().max()).item() <= 0.1
    big = loop32.abs() > 0.1 * loop32.abs().max()
    assert (loop16[big].sign() == loop32[big].sign()).all()
    assert not torch.equal(loop16, loop32)   # bf16 really ran


def all_finite(rows):
    """Every number in metrics.jsonl rows is finite (NaN and inf are written as NaN/Infinity)."""
    def numbers(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from numbers(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield x
    return all(math.isfinite(v) for r in rows for v in numbers(r))


def test_sft_then_i_ppo_then_evaluation_in_bf16(tiny_dir, tmp_path):
    from safetensors.torch import load_file
    sft = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "sft"), *SMALL, "--dtype", "bf16",
                      "--algo", "sft", "--iterations", "1", "--eval-every", "1", "--lr", "1e-2"])
    ippo = train.main(["--model", tiny_dir, "--run-dir", str(tmp_path / "ippo"), *SMALL, "--dtype", "bf16",
                       "--init-adapter", str(sft), "--iterations", "1", "--eval-every", "1", "--lr", "1e-2"])
    for run_dir in (sft, ippo):
        assert json.loads((Path(run_dir) / "config.json").read_text())["dtype"] == "bf16"
        rows = metrics(run_dir)
        assert rows[-1]["iteration"] == 1 and all_finite(rows)
        tensors = load_file(Path(run_dir) / "checkpoints" / "iter_000001" / "adapter.safetensors")
        assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in tensors.values())
    rows = metrics(ippo)
    assert all("score_mean" in r and "policy_loss" in r for r in rows[1:])
    assert any(r["policy_loss"] != 0 for r in rows[1:])
    # The adapter moved in bf16 training (SFT's B starts at zero).
    sft_b = load_file(Path(sft) / "checkpoints" / "iter_000001" / "adapter.safetensors")
    assert any(t.abs().max() > 0 for k, t in sft_b.items() if k.endswith("lora_B"))
    out = tmp_path / "eval.json"
    evaluate.main(["--model", tiny_dir, "--adapter", str(ippo), "--dtype", "bf16", "--dataset", "arith",
                   "--limit", "4", "--metrics", "em,pass@2", "--samples", "2", "--max-new-tokens", "6",
                   "--no-progress", "--out", str(out)])
    result = json.loads(out.read_text())
    assert all(math.isfinite(m["value"]) for m in result["metrics"].values())
