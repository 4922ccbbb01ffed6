"""rollout.sample: pure temperature sampling with a shared prefill, its own log-probs, and the
check of those against pi_old (logbook.sampler_drift)."""
import torch

import logbook
import train
from model import eos_token_ids, load_policy
from rollout import encode_prompts, generate_rollouts, old_and_ref_logprobs, plain_generate, token_logprobs
from transformers import GenerationConfig

PROMPTS = ["Question: 12+30?\nAnswer:", "Q: 7?", "What is 1 more than 99?"]


def test_the_sampler_draws_what_generate_draws_with_the_same_seed(tiny_dir):
    """Shared prefill or not, the same seed gives the same tokens as transformers' generate()
    with no logits processor: the same distribution, drawn the same way."""
    policy, tok = load_policy(tiny_dir, quiet=True)
    rollouts = generate_rollouts(policy, tok, PROMPTS, n_samples=4, max_new_tokens=12, temperature=0.7, seed=3,
                                 batch_size=12, progress=False)
    ids, mask = encode_prompts(tok, PROMPTS)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=12,
                              eos_token_id=eos_token_ids(tok), pad_token_id=tok.pad_token_id)
    torch.manual_seed(3)
    reference = plain_generate(policy.lm, ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0), config)
    expected = [tok.decode(r[ids.shape[1]:], skip_special_tokens=True) for r in reference]
    assert rollouts.responses == expected
    assert len(set(rollouts.responses)) > 1


def test_the_sampler_log_probs_are_pi_old_up_to_rounding(tiny_dir):
    policy, tok = load_policy(tiny_dir, quiet=True)
    rollouts = generate_rollouts(policy, tok, PROMPTS, n_samples=2, max_new_tokens=10, temperature=0.6, seed=0,
                                 batch_size=2, progress=False)   # one prompt a call
    with torch.no_grad():
        old, _, _ = token_logprobs(policy, rollouts, 0.6)
    mask = rollouts.response_mask.bool()
    assert (rollouts.sampler_logprobs[~mask] == 0).all()
    assert (rollouts.sampler_logprobs[mask] < 0).all()
    torch.testing.assert_close(rollouts.sampler_logprobs[mask], old[mask], rtol=0, atol=1e-4)


def test_a_gap_between_sampler_and_pi_old_is_logged_and_warned(tiny_dir):
    policy, tok = load_policy(tiny_dir, quiet=True)
    rollouts = generate_rollouts(policy, tok, PROMPTS, n_samples=2, max_new_tokens=10, temperature=0.6, seed=0,
                                 batch_size=6, progress=False)
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(policy, rollouts, 0.6, 6, ref=False)
    drift = logbook.sampler_drift(rollouts, torch.float32)
    assert drift["sampler_gap_max"] < drift["sampler_tolerance"] == 1e-3
    assert "sampler_gap" not in logbook.batch_warnings(train.Config(), torch.tensor([0.0, 1.0]),
                                                     torch.tensor([False, False]), 2, drift)
    # pi_old taken at another temperature than the tokens were drawn at: the check sees it
    with torch.no_grad():
        rollouts.old_logprobs, _, _ = token_logprobs(policy, rollouts, 1.0)
    drift = logbook.sampler_drift(rollouts, torch.float32)
    assert drift["sampler_gap_max"] > 1e-3
    warnings = logbook.batch_warnings(train.Config(), torch.tensor([0.0, 1.0]), torch.tensor([False, False]), 2, drift)
    assert "sampler_gap" in warnings and "not drawn from the pi_old" in warnings["sampler_gap"]
