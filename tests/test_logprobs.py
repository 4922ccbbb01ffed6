"""Lean log-probs (LM head on response tokens only, chunked, recomputed in backward) against
the plain full-vocabulary log_softmax + gather."""
import pytest
import torch

import rollout
from model import load_policy, lora_parameters
from rollout import encode_pairs, token_logprobs


@pytest.mark.parametrize("chunk", [3, 256])
def test_lean_logprobs_equal_plain_and_so_do_gradients(tiny_dir, monkeypatch, chunk):
    monkeypatch.setattr(rollout, "LOGIT_CHUNK", chunk)
    policy, tok = load_policy(tiny_dir, quiet=True)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.normal_(0, 0.3)
    seqs = encode_pairs(tok, ["Q: 2+2?", "Question: what is 10 - 3?", "Hi"],
                        ["#### 4", "10 - 3 = 7\n#### 7", "a longer answer, with words: #### 5"])
    out = {}
    for lean in (False, True):
        lp, values, ent = token_logprobs(policy, seqs, temperature=0.7, with_entropy=True, lean=lean)
        loss = (lp * torch.linspace(-1, 1, lp.shape[1])).sum() + 0.3 * ent.sum()
        grads = torch.autograd.grad(loss, lora_parameters(policy))
        out[lean] = (lp, ent, values, torch.cat([g.reshape(-1) for g in grads]))
    for plain, lean in zip(out[False], out[True]):
        torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)
    assert (out[True][0][seqs.response_mask == 0] == 0).all()
