"""The PPO math as pure tensor functions (no model, no state).

Shapes: N episodes, T response tokens (right-padded); per-token tensors are (N, T) and
`mask` is 1.0 on real response tokens (EOS included), 0.0 on padding. Per-episode tensors
are (N,). Every function says over what it averages.

Public functions:
    kl_penalized_rewards(task_rewards, logprobs, ref_logprobs, mask, beta) -> (rewards, kl)
    gae(rewards, values, mask, gamma, lam)          -> (advantages, returns)   GAE, eq. 11-12
    group_advantages(rewards, groups, eps)          -> (N,) GRPO: (r_i - group mean) / (group std + eps)
    whiten(x, mask, eps, reduce_sum=None, std_floor=0) -> x normalised over all masked tokens
                                                       (reduce_sum: over ranks under torchrun)
    policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps) -> (N,) clipped surrogate
    value_loss(values, old_values, returns, mask, clip_eps) -> (N,) clipped value loss
    clip_fraction(logprobs, old_logprobs, mask, clip_eps)   -> (N,) share of clipped tokens
    approx_kl(logprobs, old_logprobs, mask)         -> (N,) KL(pi_old || pi_theta) estimate per episode
    explained_variance(values, returns, mask)       -> 1 - Var(R - V) / Var(R) over all tokens
    masked_mean(x, mask)                            -> (N,) token mean per episode
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-episode mean over its response tokens: sum_t mask*x / sum_t mask. (N, T) -> (N,).
    An episode with no tokens gets 0 (its denominator is clamped to 1)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def kl_penalized_rewards(task_rewards, logprobs, ref_logprobs, mask, beta: float):
    """Per-token reward r_t = -beta * (log pi(a_t) - log pi_ref(a_t)), plus the episode's task
    reward at its last response token (Ouyang et al. 2022, eq. 2, as a per-token sum).

    task_rewards (N,); logprobs, ref_logprobs, mask (N, T). Returns (rewards, kl), both (N, T),
    where kl is the per-token estimate log pi - log pi_ref (zero outside the mask).
    ref_logprobs None (not computed: beta must be 0) gives kl None and the task rewards alone."""
    if ref_logprobs is None:
        if beta != 0:
            raise ValueError(f"kl_penalized_rewards: beta = {beta} needs the reference log-probs")
        kl, rewards = None, torch.zeros_like(mask)
    else:
        kl = (logprobs - ref_logprobs) * mask                               # (N, T)
        rewards = -beta * kl                                                # (N, T)
    last = (mask.sum(-1).long() - 1).clamp(min=0)                           # (N,) index of the last token
    has_tokens = mask.sum(-1) > 0
    rewards[torch.arange(len(task_rewards)), last] += task_rewards * has_tokens
    return rewards, kl


def gae(rewards, values, mask, gamma: float, lam: float):
    """Generalised advantage estimation (Schulman et al. 2016, eq. 11-12).

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where a
    position outside the mask ends the episode (V and A after the last token are 0).
    rewards, values, mask: (N, T). Returns (advantages, returns = advantages + values), both
    (N, T) and zero outside the mask."""
    N, T = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros(N, dtype=rewards.dtype, device=rewards.device)   # (N,)
    next_value = torch.zeros(N, dtype=rewards.dtype, device=rewards.device)       # (N,)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = next_advantage
        # A masked-out position is past the end: what follows it contributes nothing.
        next_value = values[:, t] * mask[:, t]
    returns = (advantages + values) * mask
    return advantages, returns


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage (Shao et al. 2024, DeepSeekMath, section 4.1.2, outcome
    supervision): A_i = (r_i - mean_g r) / (std_g r + eps) over the episodes g of i's prompt, with
    the population std (denominator |g|). A group whose rewards are all equal gets 0 everywhere;
    a group of one episode too. rewards, groups: (N,) (groups: any integer label per prompt).
    Returns (N,); the caller gives every token of episode i the advantage A_i."""
    advantages = torch.zeros_like(rewards)
    for g in groups.unique():
        members = groups == g
        r = rewards[members]
        advantages[members] = (r - r.mean()) / (r.std(unbiased=False) + eps)
    return advantages


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, reduce_sum=None,
           std_floor: float = 0.0, weights: torch.Tensor | None = None) -> torch.Tensor:
    """(x - mean) / max(std, std_floor), with mean and (biased) variance over all masked tokens
    of all episodes together; zero outside the mask. (N, T) -> (N, T).
    `std_floor` keeps a batch with (almost) no spread, such as one whose rewards are all equal,
    from being blown up to unit variance: its advantages stay small instead of turning value
    noise into full-size steps. `reduce_sum`, if given, is applied to each sum (the token count
    included) before it is used: under torchrun it sums over ranks, so the statistics are those
    of the whole batch. `weights` (N,), if given, weights each episode's tokens in the mean and
    the variance (train.py --rewhiten-kept: w_i over the kept episodes, 0 elsewhere)."""
    mean, var = batch_mean_var(x, mask if weights is None else mask * weights[:, None], reduce_sum)
    std = torch.sqrt(var + eps).clamp(min=std_floor)
    return (x - mean) / std * mask


def batch_mean_var(x: torch.Tensor, mask: torch.Tensor, reduce_sum=None):
    """Mean and biased variance of x over all masked tokens of all episodes (scalars), each
    token weighted by its mask value (0 or 1, or a weight); `reduce_sum` as in whiten."""
    sum_all = reduce_sum or (lambda t: t)
    n = sum_all(mask.sum()).clamp(min=1e-12)
    mean = sum_all((x * mask).sum()) / n
    return mean, sum_all((mask * (x - mean) ** 2).sum()) / n


def policy_loss(logprobs, old_logprobs, advantages, mask, clip_eps: float) -> torch.Tensor:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) as a loss, per episode:
    L_i = mean_t max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps, 1 + eps)),
    ratio_t = exp(log pi - log pi_old); the mean is over episode i's response tokens.
    All inputs (N, T); returns (N,)."""
    ratio = torch.exp(logprobs - old_logprobs)                              # (N, T)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return masked_mean(torch.maximum(unclipped, clipped), mask)            # (N,)


def value_loss(values, old_values, returns, mask, clip_eps: float) -> torch.Tensor:
    """Clipped value loss, per episode: mean_t 0.5 * max((V - R)^2, (V_clip - R)^2) with
    V_clip = V_old + clip(V - V_old, -eps, eps) (as in OpenAI baselines' PPO2); clip_eps = 0
    means no clipping, mean_t 0.5 (V - R)^2. All inputs (N, T); returns (N,)."""
    if clip_eps == 0:
        return masked_mean(0.5 * (values - returns) ** 2, mask)            # (N,)
    values_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    loss = 0.5 * torch.maximum((values - returns) ** 2, (values_clipped - returns) ** 2)
    return masked_mean(loss, mask)                                          # (N,)


def clip_fraction(logprobs, old_logprobs, mask, clip_eps: float) -> torch.Tensor:
    """Per episode, the share of response tokens whose ratio lies outside [1-eps, 1+eps]."""
    ratio = torch.exp(logprobs - old_logprobs)
    return masked_mean(((ratio - 1.0).abs() > clip_eps).float(), mask)


def approx_kl(logprobs, old_logprobs, mask) -> torch.Tensor:
    """Per episode, the token mean of (ratio - 1) - log ratio, ratio = pi_theta / pi_old: an
    unbiased, never negative estimate of KL(pi_old || pi_theta) from tokens sampled from pi_old
    (Schulman's "k3" estimator, as CleanRL logs it). All inputs (N, T); returns (N,)."""
    log_ratio = logprobs - old_logprobs
    return masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)


def explained_variance(values, returns, mask, reduce_sum=None) -> float:
    """1 - Var(R - V) / Var(R) over all masked tokens of all episodes (biased variances): 1 when
    the value head predicts the returns, 0 when it does no better than their mean, negative when
    worse. nan when the returns do not vary (beyond float rounding: R = A + V is computed, so
    equal returns can differ in the last bits, and 1 - Var(R - V) / 1e-15 means nothing).
    `reduce_sum` as in whiten."""
    mean_returns, var_returns = batch_mean_var(returns, mask, reduce_sum)
    if float(var_returns) <= 1e-10 * (1.0 + float(mean_returns) ** 2):
        return float("nan")
    _, var_error = batch_mean_var(returns - values, mask, reduce_sum)
    return float(1.0 - var_error / var_returns)
