"""One iteration of I-PPO on the real offline Gemma-3-270M (a few minutes on 2 CPU cores)."""
import json

import pytest

import train


@pytest.mark.slow
def test_one_iteration_on_the_offline_gemma_270m(tmp_path):
    run_dir = train.main(["--iterations", "1", "--prompts-per-iter", "2", "--samples-per-prompt", "2",
                          "--max-new-tokens", "32", "--val-size", "4", "--eval-every", "0", "--no-progress",
                          "--data-source", "local", "--run-dir", str(tmp_path / "run")])
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["iteration"] == 1 and row["episodes"] == 4
    assert row["g_val_norm"] > 0 and row["score_min"] <= row["score_max"]
    assert (run_dir / "checkpoints" / "iter_000001" / "adapter.safetensors").exists()
    episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert all(e["response"] for e in episodes)  # the real model writes text


@pytest.mark.slow
def test_onepass_equals_loop_on_the_offline_gemma_270m():
    import torch

    from influence import episode_gradients, influence_scores, validation_gradient
    import speedups
    from speedups import onepass_scores
    from model import load_policy, lora_parameters
    from offline_models import model_source
    from ppo import whiten
    from tasks import load_task, make_prompt
    from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs

    torch.manual_seed(0)  # the LoRA A initialisation
    policy, tok = load_policy(model_source("gemma-3-270m"), quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero B, as after some training
        for p in lora_parameters(policy)[1::2]:
            p.copy_(torch.randn(p.shape, generator=g) * 1e-3)
    examples = load_task("gsm8k", "train", "local").examples[:3]
    rollouts = generate_rollouts(policy, tok, [make_prompt(e.question) for e in examples], n_samples=2,
                                 max_new_tokens=24, temperature=1.0, seed=0, progress=False)
    # The inputs by the lean log-probs (faster on a 262k vocabulary); the loop and one-pass scores are compared.
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
        policy, rollouts, 1.0, 16, ref=False, logprobs=speedups.token_logprobs)
    advantages = whiten(torch.randn(rollouts.response_mask.shape, generator=g), rollouts.response_mask)
    val = encode_pairs(tok, [make_prompt(e.question) for e in examples[:2]], [e.solution for e in examples[:2]])
    g_val = validation_gradient(policy, val, logprobs=speedups.token_logprobs)
    loop = influence_scores(episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=1.0), g_val)
    # batch_size=1: the same forward shapes as the loop, so only the scoring method differs.
    # Batched (6 at once) it differs by fp32 rounding of the forward itself (a few 1e-5).
    for batch_size, tol in ((1, 1e-5), (6, 1e-4)):
        onepass = onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=1.0,
                                 batch_size=batch_size)
        assert ((onepass - loop).abs().max() / loop.abs().max()).item() <= tol
