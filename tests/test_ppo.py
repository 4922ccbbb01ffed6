"""The PPO math against brute-force loops and hand-worked numbers."""
import math

import pytest
import torch

from ppo import (approx_kl, clip_fraction, explained_variance, gae, group_advantages, kl_penalized_rewards,
                 masked_mean, policy_loss, value_loss, whiten)


def brute_force_gae(rewards, values, length, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t, V_length = 0."""
    v = list(values[:length]) + [0.0]
    deltas = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(length)]
    adv = [sum((gamma * lam) ** l * deltas[t + l] for l in range(length - t)) for t in range(length)]
    return adv, [a + v[t] for t, a in enumerate(adv)]


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_discounted_sums(gamma, lam):
    g = torch.Generator().manual_seed(0)
    N, T = 4, 7
    rewards = torch.randn(N, T, generator=g, dtype=torch.float64)
    values = torch.randn(N, T, generator=g, dtype=torch.float64)
    lengths = [7, 3, 1, 5]
    mask = torch.zeros(N, T, dtype=torch.float64)
    for i, L in enumerate(lengths):
        mask[i, :L] = 1
    adv, ret = gae(rewards * mask, values * mask, mask, gamma, lam)
    for i, L in enumerate(lengths):
        a_ref, r_ref = brute_force_gae(rewards[i].tolist(), values[i].tolist(), L, gamma, lam)
        assert adv[i, :L].tolist() == pytest.approx(a_ref, abs=1e-12), (
            f"GAE differs from the discounted sum A_t = sum_l (gamma lam)^l delta_(t+l) (gamma {gamma}, lam {lam}, "
            f"an episode of {L} tokens): check delta_t = r_t + gamma V_(t+1) - V_t and the recursion "
            "A_t = delta_t + gamma lam A_(t+1), run backwards from the last token")
        assert ret[i, :L].tolist() == pytest.approx(r_ref, abs=1e-12), "the returns must be R_t = A_t + V_t"
        assert (adv[i, L:] == 0).all() and (ret[i, L:] == 0).all()


def test_gae_ignores_values_beyond_the_mask():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    a1, _ = gae(rewards, torch.tensor([[0.5, 0.2, 0.0]]), mask, 1.0, 1.0)
    a2, _ = gae(rewards, torch.tensor([[0.5, 0.2, 99.0]]), mask, 1.0, 1.0)
    assert torch.equal(a1, a2), (
        "GAE bootstraps past the end of the response: the value at a padding position (99 here) changed the "
        "advantage of the last real token. The episode ends at its last response token: V after it is 0.")
    torch.testing.assert_close(a1, torch.tensor([[0.5, 0.8, 0.0]]))  # 1 - 0.5, 1 - 0.2


def test_gae_is_zero_outside_the_mask():
    """Padding carries whatever the critic and the rewards put there; none of it may leak."""
    rewards = torch.tensor([[0.0, 1.0, 3.0, 3.0], [2.0, 3.0, 3.0, 3.0]])
    values = torch.tensor([[0.5, 0.2, 4.0, 4.0], [0.1, 4.0, 4.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    advantages, returns = gae(rewards, values, mask, 0.9, 0.8)
    assert (advantages * (1 - mask) == 0).all() and (returns * (1 - mask) == 0).all(), (
        "GAE ignores the mask: advantages or returns are nonzero at padding positions. Multiply by the mask, so "
        "that A_t and R_t are 0 after the last response token.")


def test_policy_loss_hand_worked():
    old = torch.zeros(2, 3)
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 1.0]]))
    adv = torch.tensor([[1.0, -1.0, 5.0], [2.0, 1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # episode 0: max(-1.5, -1.2) = -1.2; max(0.5, 0.8) = 0.8 -> mean -0.2
    # episode 1: max(-2.2, -2.2) = -2.2; max(-0.7, -0.8) = -0.7 -> mean -1.45
    assert policy_loss(logprobs, old, adv, mask, 0.2).tolist() == pytest.approx([-0.2, -1.45], abs=1e-6)
    assert clip_fraction(logprobs, old, mask, 0.2).tolist() == pytest.approx([1.0, 0.5])


def test_policy_loss_clip_is_pessimistic_on_both_sides():
    """One token each: the loss is max(-A r, -A clip(r)): for A > 0 the clip binds above 1 + eps,
    for A < 0 below 1 - eps; elsewhere the ratio is not clipped."""
    eps, mask, old = 0.2, torch.ones(4, 1), torch.zeros(4, 1)
    ratio = torch.tensor([[1.5], [0.5], [0.5], [1.5]])
    adv = torch.tensor([[1.0], [1.0], [-1.0], [-1.0]])
    loss = policy_loss(ratio.log(), old, adv, mask, eps)
    assert loss.shape == (4,), f"policy_loss must return one loss per episode, shape (N,) = (4,); got {tuple(loss.shape)}"
    got = [round(v, 4) for v in loss.tolist()]
    assert got[0] == pytest.approx(-1.2) and got[1] == pytest.approx(-0.5), (
        f"with A > 0 the loss must be -A min(r, 1 + eps): -1.2 at r = 1.5, -0.5 at r = 0.5; got {got[:2]}")
    assert got[2] == pytest.approx(0.8), (
        f"the clip is on the wrong side for a negative advantage: at A = -1, r = 0.5 the loss must be "
        f"-A clip(r) = 0.8 (the clip binds at 1 - eps, the larger loss wins); got {got[2]}")
    assert got[3] == pytest.approx(1.5), (
        f"with A < 0 and r = 1.5 nothing is clipped (the unclipped loss -A r = 1.5 is the larger); got {got[3]}")


def test_policy_loss_is_each_episodes_mean_over_its_own_tokens():
    logprobs = torch.log(torch.tensor([[1.1, 1.0, 1.0], [1.0, 0.9, 2.0]]))
    adv = torch.tensor([[1.0, 3.0, 7.0], [-2.0, 1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss = policy_loss(logprobs, torch.zeros(2, 3), adv, mask, 0.2)
    assert loss.shape == (2,), (
        f"policy_loss averaged over the wrong axis: it must return one loss per episode, the mean over that "
        f"episode's response tokens, shape (N,) = (2,); got shape {tuple(loss.shape)}")
    # episode 0: (-1.1 - 3 - 7) / 3; episode 1: (2 - 0.9) / 2, its padded token left out
    assert loss.tolist() == pytest.approx([-11.1 / 3, 0.55], abs=1e-5), (
        f"each episode's loss is the mean over its own response tokens (the mask), padding left out: expected "
        f"[-3.7, 0.55], got {[round(v, 4) for v in loss.tolist()]}")


def test_policy_loss_gradient_at_ratio_one_is_minus_advantage_times_score():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = policy_loss(logprobs, logprobs.detach(), torch.tensor([[3.0, -1.0]]), torch.ones(1, 2), 0.2)
    loss.sum().backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.5, 0.5]]))


def test_value_loss_hand_worked():
    values = torch.tensor([[1.0, 0.0, 7.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # t0: max(1, (0.7-2)^2 = 1.69) / 2 = 0.845; t1: max(0, 0.3^2) / 2 = 0.045
    assert value_loss(values, old, returns, mask, 0.2).tolist() == pytest.approx([0.445])


def test_kl_penalized_rewards_put_score_on_last_token():
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards, kl = kl_penalized_rewards(torch.tensor([1.0, 0.5]), logprobs, ref, mask, beta=0.1)
    torch.testing.assert_close(kl, torch.tensor([[0.5, -0.5, 0.0], [-1.0, 0.0, 0.0]]))
    assert rewards[1].tolist() == pytest.approx([0.1 + 0.5, 0.0, 0.0]), (
        "the task reward goes on each episode's last response token (here its only one), not on the last column "
        f"of the padded tensor: expected [0.6, 0, 0] for the one-token episode, got {rewards[1].tolist()}")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.05, 1.0], [0.1 + 0.5, 0.0, 0.0]]))


def test_kl_penalty_lowers_the_reward_where_the_policy_is_more_likely_than_the_reference():
    mask = torch.ones(1, 2)
    rewards, _ = kl_penalized_rewards(torch.tensor([0.0]), torch.tensor([[-1.0, -1.0]]), torch.tensor([[-2.0, -1.0]]),
                                      mask, beta=0.5)
    assert rewards[0, 0].item() == pytest.approx(-0.5), (
        "the KL penalty has the wrong sign: where log pi - log pi_ref = 1 the token reward must be -beta * 1 = -0.5 "
        f"(r_t = -beta (log pi - log pi_ref) pulls the policy back to the reference); got {rewards[0, 0].item():.3f}")


def test_whiten_uses_all_masked_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    y = whiten(x, mask)
    vals = [1.0, 2.0, 3.0, 4.0, 5.0]
    mean = sum(vals) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 5)
    expected = [(v - mean) / std for v in vals]
    got = y[mask.bool()].tolist()
    padding_in = [(v - 115 / 6) / math.sqrt(sum((u - 115 / 6) ** 2 for u in [*vals, 100.0]) / 6) for v in vals]
    assert got != pytest.approx(padding_in, abs=1e-4), (
        "whitening over padding: the mean and std include the padded position (100 here). They must be over the "
        "masked (real response) tokens only.")
    assert got == pytest.approx(expected, abs=1e-6), (
        f"whitening must give (x - mean) / std with the mean and the biased (population) std over all masked tokens "
        f"of all episodes together: expected {[round(v, 3) for v in expected]}, got {[round(v, 3) for v in got]}")
    assert y[0, 2] == 0, "whitened values must be 0 outside the mask"


def test_masked_mean_denominator_is_the_episode_token_count():
    x = torch.tensor([[2.0, 4.0, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(x, mask).tolist() == [3.0, 0.0]


def test_value_loss_takes_the_larger_of_the_two_errors():
    values, old, returns, mask = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    # unclipped (1 - 2)^2 = 1; clipped V_old + 0.2 = 0.2: (0.2 - 2)^2 = 3.24; the larger, halved: 1.62
    got = value_loss(values, old, returns, mask, 0.2).item()
    assert got == pytest.approx(1.62), (
        f"the clipped value loss is 0.5 max((V - R)^2, (V_clip - R)^2), the larger (pessimistic) of the two: "
        f"expected 1.62, got {got:.3f}" + (" (you took the smaller)" if got == pytest.approx(0.5) else ""))


def test_value_loss_without_clipping():
    values = torch.tensor([[1.0, 0.0, 7.0]])
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # t0: (1 - 2)^2 / 2 = 0.5; t1: 0 -> mean 0.25 (a clip of 0.2 would have given 0.445)
    assert value_loss(values, old, returns, mask, 0.0).tolist() == pytest.approx([0.25])


def test_whiten_floor_keeps_a_flat_batch_small():
    x = torch.tensor([[0.30, 0.31, 0.29], [0.30, 0.30, 0.32]])    # rewards all equal: only value noise
    mask = torch.ones(2, 3)
    vals = x.flatten().tolist()
    mean = sum(vals) / 6
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 6)
    assert whiten(x, mask).flatten().tolist() == pytest.approx([(v - mean) / std for v in vals], abs=1e-4)
    floored = whiten(x, mask, std_floor=0.1).flatten().tolist()
    assert floored == pytest.approx([(v - mean) / 0.1 for v in vals], abs=1e-5)
    assert max(abs(v) for v in floored) < 0.2
    # a batch with a real spread is not touched by the floor
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(whiten(y, mask, std_floor=0.1), whiten(y, mask))


def test_approx_kl_against_exact_kl_of_sampled_tokens():
    """k3 = mean over tokens a ~ pi_old of (r - 1 - log r), r = pi/pi_old: its expectation is
    KL(pi_old || pi). Checked exactly on enumerated tokens, weighted by pi_old."""
    old = torch.tensor([0.5, 0.3, 0.2])
    new = torch.tensor([0.4, 0.4, 0.2])
    # one "episode" per token of the vocabulary, weighted by its probability under pi_old
    k3 = approx_kl(new.log()[:, None], old.log()[:, None], torch.ones(3, 1))       # (3,)
    exact = sum(o * math.log(o / n) for o, n in zip(old.tolist(), new.tolist()))
    assert float((old * k3).sum()) == pytest.approx(exact, rel=1e-5)
    assert (k3 >= 0).all()
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    lp, olp = torch.tensor([[-1.0, -2.0, 5.0]]), torch.tensor([[-1.5, -2.0, 0.0]])
    r = math.exp(0.5)
    assert approx_kl(lp, olp, mask).tolist() == pytest.approx([(r - 1 - 0.5) / 2])


def test_explained_variance_against_numbers():
    returns = torch.tensor([[1.0, 1.0, 9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    values = torch.tensor([[0.8, 0.6, 0.0], [0.2, 0.0, 0.0]])
    r = [1.0, 1.0, 0.0, 0.0]
    v = [0.8, 0.6, 0.2, 0.0]

    def var(xs):
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / len(xs)
    expected = 1 - var([a - b for a, b in zip(r, v)]) / var(r)
    assert explained_variance(values, returns, mask) == pytest.approx(expected)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert math.isnan(explained_variance(values, torch.ones(2, 3), mask))
    # Equal returns that differ only by float rounding (R = A + V is computed) do not vary either.
    rounded = -torch.ones(2, 3) + torch.tensor([[0.0, 6e-8, -6e-8], [1.2e-7, 0.0, 0.0]])
    assert math.isnan(explained_variance(values, rounded, mask))


def test_group_advantages_hand_worked():
    """Groups of sizes 3, 2, 1 and 2 (one all-equal): (r - group mean) / (population std + eps)."""
    scores = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0, 1.0])
    groups = torch.tensor([7, 7, 7, 2, 2, 9, 4, 4])
    std = math.sqrt(2 / 9)                                     # of [1, 0, 0]: mean 1/3
    expected = [(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std, 0.0, 0.0, 0.0, -1.0, 1.0]
    got = group_advantages(scores, groups, eps=0.0 + 1e-12).tolist()
    assert got[5] == 0.0 and got[3:5] == [0.0, 0.0], (
        "a group of one sample, or one whose rewards are all equal, has advantage 0: each prompt's mean and std "
        f"come from its own samples only, not from the whole batch (got {[round(v, 3) for v in got[3:6]]})")
    assert got[6:] == pytest.approx([-1.0, 1.0], abs=1e-6), (
        "the group std is the population std (divide by the group size |g|, unbiased=False): rewards 0 and 1 "
        f"give -1 and +1; got {[round(v, 3) for v in got[6:]]}")
    assert got == pytest.approx(expected, abs=1e-6), (
        f"A_i = (r_i - mean_g) / (std_g + eps) over each prompt's samples: expected "
        f"{[round(v, 3) for v in expected]}, got {[round(v, 3) for v in got]}")
