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
    validation set (one token-level mean, not a mean of per-example means).

Public functions:
    sft_nll(policy, seqs)                        -> (N,) summed NLL per example, (N,) token counts
    validation_gradient(policy, val_seqs, ...)   -> g_val, a flat (P,) fp32 vector
    episode_gradients(policy, rollouts, advantages, ...) -> (N, P), one backward pass per episode
    influence_scores(episode_grads, g_val)       -> (N,) scores s_i
    onepass_scores(policy, rollouts, advantages, g_val, ...) -> (N,) the same scores from one
                                                    batched forward + backward (no g_i in memory)
    scoring_forward(policy, part, temperature), scoring_backward(policy, forwards, old, adv, g_val)
                                                 -> its two halves (train.py --passes shared
                                                    takes pi_old and V_old from the forwards)
    filter_and_reweight(scores)                  -> (keep (N,) bool, weights (N,))
    binary_filter(scores)                        -> the same filter, every kept weight 1
    random_filter(scores, generator)             -> drop as many as the scores would, at random
    detection_auc(scores, positive)              -> how well the scores rank the positives first
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from model import LoRALinear, lora_parameters
from ppo import policy_loss
from rollout import Rollouts, Sequences, token_logprobs


def _flat(grads, params) -> torch.Tensor:
    """Concatenate per-parameter gradients into one fp32 vector (zeros for unused ones)."""
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                      for g, p in zip(grads, params)])


def sft_nll(policy, seqs: Sequences):
    """Negative log-likelihood of the given responses at temperature 1.
    Returns (nll, n_tokens), both (N,): the sum over each example's response tokens, and
    how many tokens that is."""
    logprobs, _, _ = token_logprobs(policy, seqs, temperature=1.0)         # (N, T)
    return -(logprobs * seqs.response_mask).sum(-1), seqs.response_mask.sum(-1)


def validation_gradient(policy, val_seqs: Sequences, batch_size: int = 8, progress: bool = False,
                        n_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """g_val = grad over the LoRA parameters of  (sum of NLL over all validation reference
    tokens) / (number of those tokens). Accumulated over batches; returns (P,) fp32.
    `n_tokens` overrides the denominator: under torchrun each rank holds a share of the
    validation set and divides by the token count of all shares, so the sum over ranks of
    the returned vectors is g_val of the whole set."""
    params = lora_parameters(policy)
    n_tokens_total = val_seqs.response_mask.sum() if n_tokens is None else n_tokens
    g_val = torch.zeros(sum(p.numel() for p in params), device=val_seqs.response_mask.device)
    for s in tqdm(range(0, len(val_seqs), batch_size), desc="g_val", unit="batch", disable=not progress, leave=False):
        part = val_seqs.select(range(s, min(s + batch_size, len(val_seqs))))
        # Only the response columns this batch uses (the prompt side is trimmed in token_logprobs):
        # the set is padded to its longest solution, and a batch of shorter ones need not pay for it.
        width = int(part.response_mask.sum(1).max())
        part = Sequences(part.prompt_ids, part.prompt_mask, part.response_ids[:, :width], part.response_mask[:, :width])
        nll, _ = sft_nll(policy, part)
        loss = nll.sum() / n_tokens_total
        g_val += _flat(torch.autograd.grad(loss, params, allow_unused=True), params)
    return g_val


def episode_gradients(policy, rollouts: Rollouts, advantages: torch.Tensor, *, clip_eps: float,
                      temperature: float, progress: bool = False) -> torch.Tensor:
    """g_i for every episode: one forward and one backward pass per episode (the readable
    reference path). L_i is ppo.policy_loss of episode i alone, at the current parameters
    (= theta_old when called before the update, where the ratio is 1).
    advantages (N, T). Returns (N, P) fp32, row i = grad of L_i over the LoRA parameters."""
    params = lora_parameters(policy)
    rows = []
    for i in tqdm(range(len(rollouts)), desc="scoring", unit="ep", disable=not progress, leave=False):
        episode = rollouts.select([i])
        logprobs, _, _ = token_logprobs(policy, episode, temperature)       # (1, T)
        loss_i = policy_loss(logprobs, episode.old_logprobs, advantages[i:i + 1],
                             episode.response_mask, clip_eps)[0]
        rows.append(_flat(torch.autograd.grad(loss_i, params, allow_unused=True), params))
    return torch.stack(rows)


def influence_scores(episode_grads: torch.Tensor, g_val: torch.Tensor) -> torch.Tensor:
    """s_i = g_i . g_val (a plain dot product over the LoRA parameters). (N, P), (P,) -> (N,)."""
    # Accumulated in float64: ~10^6 products whose fp32 sum would carry ~1e-5 relative error.
    return (episode_grads.double() @ g_val.double()).float()


def onepass_scores(policy, rollouts: Rollouts, advantages: torch.Tensor, g_val: torch.Tensor, *, clip_eps: float,
                   temperature: float, batch_size: int = 16) -> torch.Tensor:
    """s_i = g_i . g_val for every episode from ONE forward and backward of sum_i L_i.

    Derivation. A LoRA layer computes y_t = W0 x_t + s B u_t with u_t = A x_t. With
    d_t = dL/dy_t, its gradients are dL/dB = s sum_t d_t u_t^T and dL/dA = s sum_t (B^T d_t) x_t^T.
    Dotting with the matching slices V_B, V_A of g_val:
        <dL/dB, V_B> = s sum_t d_t^T V_B u_t,      <dL/dA, V_A> = s sum_t (B^T d_t)^T V_A x_t.
    Episodes are independent rows of the batch, so the rows of d belonging to episode i are
    exactly dL_i/dy for L = sum_j L_j; summing the terms above over episode i's positions and
    over layers gives s_i exactly. Hooks record x and d per layer; no per-episode gradient is
    ever formed. `batch_size` episodes share one forward/backward (memory only).
    Returns (N,) fp32; equal to influence_scores(episode_gradients(...), g_val) (tested).

    Each batch is one scoring_forward (the forward at theta_old, recording x) followed by its
    scoring_backward. The shared-pass path (train.py --passes shared) runs all the forwards
    first and takes the old log-probs and values from them, then the backwards."""
    scores = []
    for s in range(0, len(rollouts), batch_size):
        index = torch.arange(s, min(s + batch_size, len(rollouts)))
        forward = scoring_forward(policy, rollouts.select(index), temperature)
        forward.index = index
        scores.append(scoring_backward(policy, [forward], rollouts.old_logprobs, advantages, g_val, clip_eps=clip_eps))
    return torch.cat(scores)


class ScoringForward:
    """One batch's forward at theta_old with its graph kept: log pi (with grad), V (detached),
    and per LoRA layer the input x (recorded now) and, once the backward has run, dL/dy."""
    def __init__(self, logprobs, values, mask, seen, index=None):
        self.logprobs, self.values, self.mask, self.seen, self.index = logprobs, values, mask, seen, index


def scoring_forward(policy, part: Sequences, temperature: float) -> ScoringForward:
    """The forward half of onepass_scores for the episodes `part`: token_logprobs with hooks on
    every LoRA layer recording its input x and registering for its output gradient d."""
    layers = [m for m in policy.modules() if isinstance(m, LoRALinear)]
    seen, calls = {}, [0] * len(layers)  # layer index -> [x, d]; forward calls per layer

    def record(k):
        def hook(module, inputs, output):
            calls[k] += 1
            seen[k] = [inputs[0].detach(), None]
            output.register_hook(lambda grad: seen[k].__setitem__(1, grad))
        return hook

    handles = [layer.register_forward_hook(record(k)) for k, layer in enumerate(layers)]
    try:
        logprobs, values, _ = token_logprobs(policy, part, temperature)
    finally:
        for h in handles:
            h.remove()
    check_one_call_per_layer(policy, layers, calls)
    return ScoringForward(logprobs, values.detach(), part.response_mask, seen)


def scoring_backward(policy, forwards: list[ScoringForward], old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     g_val: torch.Tensor, *, clip_eps: float) -> torch.Tensor:
    """The backward half of onepass_scores: for each recorded forward (its `index` says which
    episodes of the buffer it holds), the backward of sum_i L_i, then the contraction of x and
    d with g_val. Returns the scores of all forwards' episodes in order, (n,) fp32."""
    layers = [m for m in policy.modules() if isinstance(m, LoRALinear)]
    params = lora_parameters(policy)
    slices, offset = [], 0
    for layer in layers:  # g_val is laid out as A, B of each layer in order (lora_parameters)
        a, b = layer.lora_A.numel(), layer.lora_B.numel()
        slices.append((g_val[offset:offset + a].view_as(layer.lora_A),
                       g_val[offset + a:offset + a + b].view_as(layer.lora_B)))
        offset += a + b
    scores = []
    for f in forwards:
        idx = f.index.to(advantages.device)
        loss = policy_loss(f.logprobs, old_logprobs[idx], advantages[idx], f.mask, clip_eps).sum()
        torch.autograd.grad(loss, params, allow_unused=True)  # runs the backward; fills d, frees the graph
        seen = f.seen
        # Per layer, both terms in two matmuls: x [A; V_A]^T = [u, V_A x] and d [V_B, B] = [V_B^T d, B^T d],
        # so their elementwise product summed over the last dim is d^T V_B u + (B^T d)^T V_A x.
        # The matmuls run in the adapters' dtype (fp32); the sums over positions and layers (~10^5 terms of both signs
        # per episode) are accumulated in float64.
        part_scores = torch.zeros(len(idx), device=g_val.device, dtype=torch.float64)
        with torch.no_grad():
            for k, (layer, (V_A, V_B)) in enumerate(zip(layers, slices)):
                dtype = layer.lora_A.dtype  # fp32 (LoRA weights always are), fp64 in the benchmark's check
                if seen[k][1] is None:      # the layer ran but the loss does not depend on it: adds 0
                    continue
                x, d = seen[k][0].to(dtype), seen[k][1].to(dtype)                    # (n, L, in), (n, L, out)
                left = x @ torch.cat([layer.lora_A, V_A.to(dtype)]).T                # (n, L, 2r)
                right = d @ torch.cat([V_B.to(dtype), layer.lora_B], dim=1)          # (n, L, 2r)
                per_position = (left * right).sum(-1)                                # (n, L)
                part_scores += layer.scale * per_position.double().sum(-1)           # sum over positions
        f.seen = None                                                                # x and d: no longer needed
        scores.append(part_scores.float())
    return torch.cat(scores)


def check_one_call_per_layer(policy, layers: list, calls: list[int]) -> None:
    """onepass_scores records one input and one output gradient per LoRA layer and forward
    pass: a layer that runs twice (weight sharing) would overwrite its first record and give
    wrong scores, one that never runs has none. Refuse both, naming the layer."""
    names = {id(m): name for name, m in policy.named_modules()}
    wrong = [f"{names.get(id(layer), '?')} ran {n} times" for layer, n in zip(layers, calls) if n != 1]
    if wrong:
        raise SystemExit(f"--influence-method onepass assumes every LoRA layer runs exactly once per forward pass; "
                         f"in this model {', '.join(wrong)}. Use --influence-method loop (per-episode gradients "
                         "by autograd, correct for any model).")


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


def detection_auc(scores: torch.Tensor, positive: torch.Tensor) -> float | None:
    """The area under the ROC curve of `scores` for telling the `positive` episodes (bool (N,))
    from the others: the probability that a random positive scores above a random negative,
    ties counting one half (Mann-Whitney). 1: every positive above every negative; 0.5: no
    better than chance. None when either class is empty. With planted reward noise the
    positives are the episodes whose reward was not flipped (train.py --reward-noise)."""
    pos, neg = scores[positive].double(), scores[~positive].double()
    if len(pos) == 0 or len(neg) == 0:
        return None
    above = (pos[:, None] > neg[None, :]).double().mean()             # every (positive, negative) pair
    ties = (pos[:, None] == neg[None, :]).double().mean()
    return (above + 0.5 * ties).item()
