"""Per-episode gradients, validation gradient, scores, filter and reweight."""
import pytest
import torch

from influence import (binary_filter, episode_gradients, filter_and_reweight, influence_scores, random_filter,
                       sft_nll, validation_gradient)
from model import load_policy, lora_parameters
from ppo import policy_loss
from rollout import encode_pairs, generate_rollouts, old_and_ref_logprobs, token_logprobs

TEMPERATURE = 0.8


def make_buffer(tiny_dir, dtype: str = "auto", rollouts=None):
    """A tiny policy (base weights in `dtype`) with non-zero LoRA B, and 6 episodes with
    left-padded prompts of different lengths and responses of different lengths (sampled, or
    `rollouts` rescored by this policy). Returns (policy, tokenizer, rollouts, advantages)."""
    policy, tok = load_policy(tiny_dir, dtype=dtype, lora_targets=("q_proj", "v_proj", "down_proj"), quiet=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in lora_parameters(policy):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    if rollouts is None:
        rollouts = generate_rollouts(policy, tok, ["Question: 12+30?\nAnswer:", "Q: 7?", "What is 1 more than 99?"],
                                     n_samples=2, max_new_tokens=9, temperature=TEMPERATURE, seed=1, progress=False)
        for i, length in enumerate([9, 4, 1, 7, 9, 2]):
            rollouts.response_mask[i, length:] = 0
            rollouts.response_ids[i, length:] = tok.pad_token_id
    rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(policy, rollouts, TEMPERATURE, 4)
    advantages = torch.randn(rollouts.response_mask.shape, generator=g) * rollouts.response_mask
    return policy, tok, rollouts, advantages


@pytest.fixture
def buffer(tiny_dir):
    return make_buffer(tiny_dir)


def same_gradient(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """assert actual == expected (rtol 1e-4), with a message that names the classic mistakes."""
    if torch.allclose(actual, expected, rtol=1e-4, atol=1e-6):
        return
    if torch.allclose(actual, -expected, rtol=1e-4, atol=1e-6):
        raise AssertionError(f"{what} has its sign flipped: it is the gradient of the objective (ascent), not of the "
                             "loss L_i (descent). g_i is grad L_i, the loss that the update lowers.")
    if actual.dim() == 2 and len(actual) > 1 and torch.allclose(actual, actual[:1].expand_as(actual)):
        raise AssertionError(f"{what}: every row is the same vector, the gradient of the whole batch's loss. Row i "
                             "must be the gradient of episode i's loss alone (one backward pass per episode).")
    raise AssertionError(f"{what} differs from the gradient computed independently (largest difference "
                         f"{(actual - expected).abs().max().item():.3g})")


def test_episode_gradients_sum_to_gradient_of_summed_loss(buffer):
    policy, _, rollouts, advantages = buffer
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE)
    logprobs, _, _ = token_logprobs(policy, rollouts, TEMPERATURE)            # all 6 at once
    total = policy_loss(logprobs, rollouts.old_logprobs, advantages, rollouts.response_mask, 0.2).sum()
    params = lora_parameters(policy)
    flat = torch.cat([g.reshape(-1) for g in torch.autograd.grad(total, params)])
    assert grads.shape == (6, flat.numel()), (
        f"episode_gradients must return (N, P) = (6, {flat.numel()}): one flat gradient over the LoRA parameters "
        f"per episode; got {tuple(grads.shape)}")
    assert (grads.norm(dim=1) > 0).all(), "some episode's gradient is 0"
    same_gradient(grads.sum(0), flat, "the sum of the episodes' gradients")


def test_each_episode_gradient_equals_torch_func_gradient(buffer):
    policy, _, rollouts, advantages = buffer
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE)
    wrapper = EpisodeLoss(policy)
    lora = {"policy." + n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
    expected = []
    for i in range(len(rollouts)):
        episode = rollouts.select([i])
        per_sample = torch.func.grad(lambda params: torch.func.functional_call(
            wrapper, params, (episode, advantages[i:i + 1])))(lora)
        expected.append(torch.cat([g.reshape(-1) for g in per_sample.values()]))
    assert grads.shape == (len(rollouts), len(expected[0])), (
        f"episode_gradients must return (N, P) = ({len(rollouts)}, {len(expected[0])}); got {tuple(grads.shape)}")
    same_gradient(grads, torch.stack(expected), "the episodes' gradients")


class EpisodeLoss(torch.nn.Module):
    """L_i as a module, so torch.func can differentiate it functionally."""
    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, episode, advantages):
        lp, _, _ = token_logprobs(self.policy, episode, TEMPERATURE)  # plain path: torch.func-able
        return policy_loss(lp, episode.old_logprobs, advantages, episode.response_mask, 0.2)[0]


def test_scores_are_explicit_dot_products(buffer):
    policy, tok, rollouts, advantages = buffer
    val = encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?", "Q: 5*5?"], ["#### 4", "10 - 3 = 7\n#### 7", "#### 25"])
    g_val = validation_gradient(policy, val, batch_size=2)
    # g_val is the gradient of one token-level mean NLL over the whole validation set
    nll, n_tokens = sft_nll(policy, val)
    direct = torch.cat([g.reshape(-1) for g in torch.autograd.grad(nll.sum() / n_tokens.sum(), lora_parameters(policy))])
    torch.testing.assert_close(g_val, direct, rtol=1e-4, atol=1e-7)
    grads = episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE)
    scores = influence_scores(grads, g_val)
    explicit = [sum(float(a) * float(b) for a, b in zip(grads[i].tolist(), g_val.tolist())) for i in range(len(rollouts))]
    assert scores.shape == (len(rollouts),), f"one score per episode, shape ({len(rollouts)},); got {tuple(scores.shape)}"
    got = scores.tolist()
    assert got != pytest.approx([-e for e in explicit], rel=1e-4, abs=1e-9), (
        "the score's sign is flipped: s_i = g_i . g_val, both gradients of losses, is positive when a descent step "
        "on episode i also lowers the validation loss")
    cosine = [e / (grads[i].norm().item() * g_val.norm().item()) for i, e in enumerate(explicit)]
    assert got != pytest.approx(cosine, rel=1e-4, abs=1e-9), (
        "that is the cosine: I-PPO's score is the plain dot product g_i . g_val, not normalised by the norms")
    assert got == pytest.approx(explicit, rel=1e-4, abs=1e-9), (
        f"s_i must be the dot product g_i . g_val over all LoRA parameters: expected {explicit}, got {got}")


def test_filter_and_reweight_invariants():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        scores = torch.randn(int(torch.randint(1, 20, (1,), generator=g)), generator=g, dtype=torch.float64)
        keep, weights = filter_and_reweight(scores)
        assert torch.equal(keep, scores > 0), "keep must be exactly the episodes with s_i > 0"
        assert (weights[~keep] == 0).all() and (weights[keep] > 0).all(), (
            "dropped episodes must weigh 0 and kept ones more than 0")
        if keep.any():
            assert weights[keep].mean().item() == pytest.approx(1.0), (
                f"the kept weights must average to 1 over the kept episodes (w_i = s_i / mean of the kept s); their "
                f"mean is {weights[keep].mean().item():.3f}" + (" (you divided by the mean over all episodes)"
                if torch.allclose(weights[keep], scores[keep] / scores.mean()) else ""))
            # weights are proportional to the scores
            ratio = weights[keep] / scores[keep]
            assert torch.allclose(ratio, ratio[0].expand_as(ratio)), "the kept weights must be proportional to s_i"


def test_nothing_kept_and_zero_scores_dropped():
    keep, weights = filter_and_reweight(torch.tensor([0.0, 2.0, 6.0]))
    assert keep.tolist() == [False, True, True], (
        "an episode whose score is exactly 0 is dropped: the filter keeps s_i > 0, not s_i >= 0")
    assert weights.tolist() == [0.0, 0.5, 1.5], (
        f"the kept weights must average to 1 over the kept episodes, w_i = s_i / mean of the kept s: scores "
        f"[0, 2, 6] give [0, 0.5, 1.5]; got {weights.tolist()}")
    keep, weights = filter_and_reweight(torch.tensor([-1.0, 0.0, -3.0]))
    assert not keep.any() and (weights == 0).all(), (
        "with no positive score nothing is kept and every weight is 0 (no division by an empty mean)")


def test_binary_and_random_filters_keep_the_same_count():
    scores = torch.tensor([0.3, -0.1, 2.0, -5.0, 0.0, 1.0])
    keep, weights = binary_filter(scores)
    assert keep.tolist() == [True, False, True, False, False, True] and weights.tolist() == [1, 0, 1, 0, 0, 1]
    chosen = set()
    for seed in range(20):
        keep, weights = random_filter(scores, torch.Generator().manual_seed(seed))
        assert keep.sum() == 3 and torch.equal(weights, keep.float())
        chosen.add(tuple(keep.tolist()))
    assert len(chosen) > 1  # really random, not the influence set


def test_onepass_scores_equal_loop_scores(buffer):
    from speedups import onepass_scores
    policy, tok, rollouts, advantages = buffer
    val = encode_pairs(tok, ["Q: 2+2?", "Q: 10-3?"], ["#### 4", "10 - 3 = 7\n#### 7"])
    g_val = validation_gradient(policy, val)
    loop = influence_scores(episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE), g_val)
    for batch_size in (6, 4, 1):
        onepass = onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=TEMPERATURE,
                                 batch_size=batch_size)
        assert ((onepass - loop).abs().max() / loop.abs().max()).item() <= 1e-5
    assert loop.abs().min() > 0


def test_onepass_refuses_a_lora_layer_that_runs_twice_or_never(buffer, monkeypatch):
    """The one-pass hooks keep one input and one output gradient per layer and forward pass:
    weight sharing (a layer run twice) or a skipped layer must be refused, not scored wrongly."""
    from speedups import onepass_scores
    policy, tok, rollouts, advantages = buffer
    val = encode_pairs(tok, ["Q: 2+2?"], ["#### 4"])
    layers = policy.lm.model.layers
    # Weight sharing: decoder layer 1 calls layer 0's q_proj (and its adapter).
    monkeypatch.setattr(layers[1].self_attn, "q_proj", layers[0].self_attn.q_proj)
    g_val = validation_gradient(policy, val)
    with pytest.raises(SystemExit, match=r"layers\.0\.self_attn\.q_proj ran 2 times.*--speedups off"):
        onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=TEMPERATURE)
    assert episode_gradients(policy, rollouts, advantages, clip_eps=0.2, temperature=TEMPERATURE).shape[0] == 6
    monkeypatch.undo()
    # A skipped decoder layer: its adapters never run.
    monkeypatch.setattr(layers[1], "forward", lambda hidden_states, *args, **kwargs: hidden_states)
    g_val = validation_gradient(policy, val)
    with pytest.raises(SystemExit, match=r"layers\.1\.self_attn\.q_proj ran 0 times"):
        onepass_scores(policy, rollouts, advantages, g_val, clip_eps=0.2, temperature=TEMPERATURE)
