"""Lean log-probs (LM head on response tokens only, chunked, recomputed in backward) against
the plain full-vocabulary log_softmax + gather."""
import pytest
import torch

import speedups
from model import load_policy, lora_parameters
from rollout import encode_pairs, token_logprobs


@pytest.mark.parametrize("chunk", [3, 256])
@pytest.mark.parametrize("uses", ["logp and entropy", "logp", "entropy", "logp, entropy only logged"])
def test_lean_logprobs_equal_plain_and_so_do_gradients(tiny_dir, monkeypatch, chunk, uses):
    """Each backward branch of TargetLogProb: the loss through log p only (the in-place one; also
    when the entropy is computed but only logged, as in the update at --ent-coef 0), through the
    entropy only, through both."""
    monkeypatch.setattr(speedups, "LOGIT_CHUNK", chunk)
    policy, tok = load_policy(tiny_dir, quiet=True)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.normal_(0, 0.3)
    seqs = encode_pairs(tok, ["Q: 2+2?", "Question: what is 10 - 3?", "Hi"],
                        ["#### 4", "10 - 3 = 7\n#### 7", "a longer answer, with words: #### 5"])
    with_entropy = uses != "logp"
    out = {}
    for lean in (False, True):
        if lean:   # the lean head alone (one forward per sequence, as in the definition)
            lp, values, ent = speedups.token_logprobs(policy, seqs, 0.7, with_entropy, share_prompts=False)
        else:
            lp, values, ent = token_logprobs(policy, seqs, temperature=0.7, with_entropy=with_entropy)
        assert (ent is None) == (not with_entropy)
        loss = (lp * torch.linspace(-1, 1, lp.shape[1])).sum() if uses != "entropy" else 0.0
        loss = loss + (0.3 * ent.sum() if uses in ("logp and entropy", "entropy") else 0.0)
        grads = torch.autograd.grad(loss, lora_parameters(policy))
        out[lean] = [x for x in (lp, ent, values, torch.cat([g.reshape(-1) for g in grads])) if x is not None]
    assert out[True][-1].abs().max() > 0          # the gradient is not trivially zero
    for plain, lean in zip(out[False], out[True]):
        torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)
    assert (out[True][0][seqs.response_mask == 0] == 0).all()


@pytest.mark.parametrize("window", [64, 6])
def test_samples_of_one_prompt_share_its_forward_with_the_same_numbers_and_gradients(tmp_path, window):
    """speedups.shared_prompt_hidden_states: the prompts' forward once, their keys and
    values copied to each sample. Prompts of different lengths (left padding), responses of
    different lengths (right padding), repeated and single prompts, rows not grouped by prompt; a
    sliding window shorter than the sequences (window 6) as well as one longer."""
    from transformers import Gemma3ForCausalLM

    from tiny_world import char_tokenizer, gemma3_config
    tok = char_tokenizer()
    config = gemma3_config(tok, "test")
    config.sliding_window, config.layer_types = window, ["sliding_attention", "full_attention"]
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy, tok = load_policy(str(tmp_path), quiet=True)
    policy.value_through_adapters = True          # so the values' gradient reaches the adapters too
    with torch.no_grad():
        for p in [*lora_parameters(policy), *policy.value_head.parameters()]:
            p.normal_(0, 0.3)
    prompts = ["Q: 2+2?", "Question: what is 10 - 3?", "Q: 2+2?", "Hi", "Question: what is 10 - 3?", "Q: 2+2?"]
    responses = ["#### 4", "10 - 3 = 7\n#### 7", "2 + 2 = 4 #### 4", "a longer answer, with words: #### 5", "7", "4"]
    seqs = encode_pairs(tok, prompts, responses)
    out, used = {}, {}
    for share in (False, True):
        counter = [0]
        hook = policy.lm.get_decoder().register_forward_pre_hook(
            lambda module, args, kwargs: counter.__setitem__(0, counter[0] + len(kwargs["input_ids"])), with_kwargs=True)
        lp, values, ent = speedups.token_logprobs(policy, seqs, 0.7, with_entropy=True, share_prompts=share)
        hook.remove()
        used[share] = counter[0]
        loss = (lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.3 * ent.sum() + values.square().sum()
        grads = torch.autograd.grad(loss, [*lora_parameters(policy), *policy.value_head.parameters()])
        out[share] = [lp, ent, values, torch.cat([g.reshape(-1) for g in grads])]
    assert used == {False: 6, True: 3 + 6}        # one row per prompt forward: 3 distinct prompts, then 6 responses
    assert out[True][-1].abs().max() > 0
    # fp32 rounding relative to each tensor's scale: the gradient sums ~10^4 products whose
    # order differs between the paths (seen: 1.5e-5 on one element of a gradient of size ~3)
    for plain, shared in zip(out[False], out[True]):
        torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5 * max(1.0, plain.abs().max().item()))
