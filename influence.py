"""Influence of each rollout episode on the validation loss, and the I-PPO filter.

I-PPO (arXiv 2604.01597) scores episode i by a first-order (TracIn-style) influence:
    s_i = g_i . g_val,
    g_i   = grad_theta of episode i's PPO clipped-surrogate loss at theta_old,
    g_val = grad_theta of the SFT loss (mean NLL of reference solutions) on a validation set.
Both are gradients of losses, so s_i > 0 means a descent step on episode i also lowers the
validation loss. Episodes with s_i <= 0 are dropped; the rest are reweighted by
w_i = s_i / mean_{j kept} s_j (mean kept weight 1).

Choices the paper leaves open, made here:
  * theta is the LoRA adapter parameters only (model.lora_parameters), not the value head;
  * the episode loss is the token mean of the clipped surrogate over its response tokens
    (value and entropy terms are not part of the score);
  * the SFT loss of g_val is the mean NLL over all reference-solution tokens of the
    validation set (one token-level mean, not a mean of per-example means);
  * g_val and g_i are gradients of the same distribution: log-probs at the sampling
    temperature, logits / T, for both (train.select_episodes passes --temperature to both).
    g_i is a gradient of the PPO loss of pi_T, the policy the update trains; taking g_val at
    T = 1 would dot gradients of two different distributions.

What the filter makes of the update. At the update's first step (theta = theta_old, ratio 1)
the gradient of episode i's loss is g_i, and the kept, reweighted policy gradient is
    (1/|D'|) sum_{i in D'} w_i g_i = (1 / sum_{j in D'} s_j) sum_{i in D'} g_i (g_i . g_val)
                                   = (1 / sum_{j in D'} s_j) G+ g_val,   G+ = sum_{i in D'} g_i g_i^T,
a positive semi-definite matrix times g_val: a preconditioned step down the validation SFT
loss. To first order every such step lowers that loss (g_val . G+ g_val >= 0); the rewards only
shape G+ through the advantages inside g_i. So I-PPO learns from its validation solutions, and
the controls that train on them directly (train.py --algo sft --sft-data val, --sft-coef) ask
what the filter adds beyond them (experiments/filter-controls/). tests/test_filter_controls.py
checks the identity on the gradient ppo_update takes.

The validation-free reference (DTV, arXiv 2609.35072), --score-against batch | batch-loo: the
episode's g_i is dotted with the mean gradient of the buffer's episodes, r = (1/N) sum_j g_j,
or without itself, (sum_j g_j - g_i) / (N - 1); DTV keeps s_i >= 0 and does not reweight.

Public functions (the definitions; speedups.py computes the same scores in one pass):
    sft_nll(policy, seqs)                        -> (N,) summed NLL per example, (N,) token counts
    validation_gradient(policy, val_seqs, ...)   -> g_val, a flat (P,) fp32 vector
    episode_gradients(policy, rollouts, advantages, ...) -> (N, P), one backward pass per episode
    group_gradients(policy, rollouts, advantages, ...)   -> (prompts, P), one per prompt (GradAlign's)
    influence_scores(episode_grads, g_val)       -> (N,) scores s_i
    loop_batch_scores(episode_grads, ...)    -> (N,) DTV's scores
    filter_and_reweight(scores)                  -> (keep (N,) bool, weights (N,))
    binary_filter(scores)                        -> the same filter, every kept weight 1
    random_filter(scores, generator)             -> drop as many as the scores would, at random
    shuffled_weights(scores, generator)          -> the same kept set, its weights permuted among it
    dtv_filter(scores)                           -> keep s_i >= 0, every kept weight 1
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from model import flat_gradient, lora_parameters
from ppo import policy_loss
from rollout import Rollouts, Sequences, token_logprobs


def sft_nll(policy, seqs: Sequences, temperature: float = 1.0, logprobs=token_logprobs):
    """Negative log-likelihood of the given responses under logits / temperature, from
    `logprobs` (rollout.token_logprobs; speedups.token_logprobs gives the same numbers faster).
    Returns (nll, n_tokens), both (N,): the sum over each example's response tokens, and
    how many tokens that is."""
    lp, _, _ = logprobs(policy, seqs, temperature)                                   # (N, T)
    return -(lp * seqs.response_mask).sum(-1), seqs.response_mask.sum(-1)


def validation_gradient(policy, val_seqs: Sequences, batch_size: int = 8, progress: bool = False,
                        n_tokens: torch.Tensor | None = None, temperature: float = 1.0, *,
                        batches: list | None = None, logprobs=token_logprobs) -> torch.Tensor:
    """g_val = grad over the LoRA parameters of  (sum of NLL over all validation reference
    tokens) / (number of those tokens), the NLL under logits / temperature (train.py: the
    sampling temperature, so that g_val and g_i are gradients of one distribution).
    Accumulated over batches of `batch_size` solutions in order (or the given `batches` of
    val_seqs, and `logprobs` for sft_nll: speedups.Passes passes batches of similar lengths
    and its faster log-probs); returns (P,) fp32.
    `n_tokens` overrides the denominator: under torchrun each rank holds a share of the
    validation set and divides by the token count of all shares, so the sum over ranks of
    the returned vectors is g_val of the whole set."""
    params = lora_parameters(policy)
    n_tokens_total = val_seqs.response_mask.sum() if n_tokens is None else n_tokens
    g_val = torch.zeros(sum(p.numel() for p in params), device=val_seqs.response_mask.device)
    batches = batches or [val_seqs.select(range(s, min(s + batch_size, len(val_seqs))))
                          for s in range(0, len(val_seqs), batch_size)]
    for part in tqdm(batches, desc="g_val", unit="batch", disable=not progress, leave=False):
        nll, _ = sft_nll(policy, part, temperature, logprobs)
        loss = nll.sum() / n_tokens_total
        g_val += flat_gradient(torch.autograd.grad(loss, params, allow_unused=True), params)
    return g_val


def episode_gradients(policy, rollouts: Rollouts, advantages: torch.Tensor, *, clip_eps: float,
                      temperature: float, progress: bool = False) -> torch.Tensor:
    """g_i for every episode: one forward and one backward pass per episode (the definition;
    speedups.onepass_scores gives g_i . g_val without forming g_i). L_i is ppo.policy_loss of episode i alone, at the current parameters
    (= theta_old when called before the update, where the ratio is 1).
    advantages (N, T). Returns (N, P) fp32, row i = grad of L_i over the LoRA parameters."""
    params = lora_parameters(policy)
    rows = []
    for i in tqdm(range(len(rollouts)), desc="scoring", unit="ep", disable=not progress, leave=False):
        episode = rollouts.select([i])
        logprobs, _, _ = token_logprobs(policy, episode, temperature)                # (1, T)
        loss_i = policy_loss(logprobs, episode.old_logprobs, advantages[i:i + 1],
                             episode.response_mask, clip_eps)[0]
        rows.append(flat_gradient(torch.autograd.grad(loss_i, params, allow_unused=True), params))
    return torch.stack(rows)


def group_gradients(policy, rollouts: Rollouts, advantages: torch.Tensor, *, clip_eps: float,
                    temperature: float) -> torch.Tensor:
    """One policy gradient per prompt (train.py --selection gradalign): row j = grad over the LoRA
    parameters of the mean of L_i over prompt j's episodes (rollouts.prompt_index), one backward
    per prompt, at the current parameters. The mean of episode_gradients' rows of the prompt (tested).
    advantages (N, T). Returns (prompts, P) fp32, prompts in the order of their first episode."""
    params, index = lora_parameters(policy), torch.as_tensor(rollouts.prompt_index)
    rows = []
    for j in dict.fromkeys(rollouts.prompt_index):
        members = torch.nonzero(index == j).squeeze(-1)
        group = rollouts.select(members)
        logprobs, _, _ = token_logprobs(policy, group, temperature)
        loss = policy_loss(logprobs, group.old_logprobs, advantages[members.to(advantages.device)],
                           group.response_mask, clip_eps).mean()
        rows.append(flat_gradient(torch.autograd.grad(loss, params, allow_unused=True), params))
    return torch.stack(rows)


def influence_scores(episode_grads: torch.Tensor, g_val: torch.Tensor) -> torch.Tensor:
    """s_i = g_i . g_val (a plain dot product over the LoRA parameters). (N, P), (P,) -> (N,)."""
    # Accumulated in float64: ~10^6 products whose fp32 sum would carry ~1e-5 relative error.
    return (episode_grads.double() @ g_val.double()).float()


def loop_batch_scores(episode_grads: torch.Tensor, *, leave_one_out: bool, reduce_sum=lambda x: x,
                          n_total: int | None = None) -> torch.Tensor:
    """DTV's scores from per-episode gradients (N, P), s_i = g_i . r (module docstring);
    speedups.onepass_batch_scores gives the same from one pass (tested)."""
    grads = episode_grads.double()
    grad_sum = reduce_sum(grads.sum(0))                                   # sum_j g_j over every rank
    n = len(grads) if n_total is None else n_total
    if leave_one_out:
        return ((grads @ grad_sum - (grads * grads).sum(-1)) / max(n - 1, 1)).float()
    return (grads @ grad_sum / n).float()


def filter_and_reweight(scores: torch.Tensor):
    """keep = s > 0; weights = s / mean(s[keep]) on kept episodes, 0 elsewhere, so the mean
    kept weight is 1. When nothing is kept, keep is all False and weights all 0: the caller
    skips the update."""
    keep = scores > 0
    weights = torch.zeros_like(scores)
    if keep.any():
        weights[keep] = scores[keep] / scores[keep].mean()
    return keep, weights


def binary_filter(scores: torch.Tensor):
    """--no-reweight: the same kept set, every kept episode weighted 1."""
    keep = scores > 0
    return keep, keep.to(scores.dtype)


def random_filter(scores: torch.Tensor, generator: torch.Generator):
    """--random-filter, the control: keep as many episodes as the influence filter would,
    chosen uniformly at random, each weighted 1."""
    n_keep = int((scores > 0).sum())
    chosen = torch.randperm(len(scores), generator=generator)[:n_keep]
    keep = torch.zeros(len(scores), dtype=torch.bool)
    keep[chosen] = True
    keep = keep.to(scores.device)
    return keep, keep.to(scores.dtype)


def shuffled_weights(scores: torch.Tensor, generator: torch.Generator):
    """--shuffle-weights, the control that tells "which episodes" from "how weighted": the kept
    set of filter_and_reweight (s > 0) with its weights w_i = s_i / mean kept s permuted at
    random among the kept episodes (so the same weights, on other episodes of the set)."""
    keep, weights = filter_and_reweight(scores)
    kept = torch.nonzero(keep).squeeze(-1)
    weights[kept] = weights[kept[torch.randperm(len(kept), generator=generator).to(kept.device)]]
    return keep, weights


def dtv_filter(scores: torch.Tensor):
    """--score-against batch | batch-loo: DTV keeps the episodes whose gradient does not oppose the
    batch's (s_i >= 0), each weighted 1; it does not reweight."""
    keep = scores >= 0
    return keep, keep.to(scores.dtype)
