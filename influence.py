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

The validation-free reference (DTV, arXiv 2609.35072), --reference batch | batch-loo: the
episode's g_i is dotted with the mean gradient of the buffer's episodes, r = (1/N) sum_j g_j,
or without itself, (sum_j g_j - g_i) / (N - 1); DTV keeps s_i >= 0 and does not reweight.

Public functions:
    sft_nll(policy, seqs)                        -> (N,) summed NLL per example, (N,) token counts
    validation_gradient(policy, val_seqs, ...)   -> g_val, a flat (P,) fp32 vector
    episode_gradients(policy, rollouts, advantages, ...) -> (N, P), one backward pass per episode
    influence_scores(episode_grads, g_val)       -> (N,) scores s_i
    onepass_scores(policy, rollouts, advantages, g_val, ...) -> (N,) the same scores from one
                                                    batched forward + backward (no g_i in memory)
    batch_reference_scores(policy, forwards, ...) -> (N,) DTV's scores, one-pass
    loop_reference_scores(episode_grads, ...)    -> (N,) the same from per-episode gradients
    scoring_forward(policy, part, temperature), scoring_backward(policy, forwards, old, adv, g_val)
                                                 -> its two halves (train.py --passes shared
                                                    takes pi_old and V_old from the forwards)
    filter_and_reweight(scores)                  -> (keep (N,) bool, weights (N,))
    binary_filter(scores)                        -> the same filter, every kept weight 1
    random_filter(scores, generator)             -> drop as many as the scores would, at random
    dtv_filter(scores)                           -> keep s_i >= 0, every kept weight 1
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


def sft_nll(policy, seqs: Sequences, temperature: float = 1.0):
    """Negative log-likelihood of the given responses under logits / temperature.
    Returns (nll, n_tokens), both (N,): the sum over each example's response tokens, and
    how many tokens that is."""
    logprobs, _, _ = token_logprobs(policy, seqs, temperature=temperature)  # (N, T)
    return -(logprobs * seqs.response_mask).sum(-1), seqs.response_mask.sum(-1)


def validation_gradient(policy, val_seqs: Sequences, batch_size: int = 8, progress: bool = False,
                        n_tokens: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """g_val = grad over the LoRA parameters of  (sum of NLL over all validation reference
    tokens) / (number of those tokens), the NLL under logits / temperature (train.py: the
    sampling temperature, so that g_val and g_i are gradients of one distribution).
    Accumulated over batches; returns (P,) fp32.
    `n_tokens` overrides the denominator: under torchrun each rank holds a share of the
    validation set and divides by the token count of all shares, so the sum over ranks of
    the returned vectors is g_val of the whole set."""
    params = lora_parameters(policy)
    n_tokens_total = val_seqs.response_mask.sum() if n_tokens is None else n_tokens
    g_val = torch.zeros(sum(p.numel() for p in params), device=val_seqs.response_mask.device)
    # Batches of solutions of similar lengths: the set is padded to its longest prompt and
    # solution, and a batch of shorter ones need not pay for that padding (the sum is the same).
    order = (val_seqs.prompt_mask.sum(1) * 1000 + val_seqs.response_mask.sum(1)).cpu().argsort(stable=True)
    for s in tqdm(range(0, len(val_seqs), batch_size), desc="g_val", unit="batch", disable=not progress, leave=False):
        part = val_seqs.select(order[s:s + batch_size])
        # Only the columns this batch uses: the response side here, the prompt side in token_logprobs.
        width = int(part.response_mask.sum(1).max())
        part = Sequences(part.prompt_ids, part.prompt_mask, part.response_ids[:, :width], part.response_mask[:, :width])
        nll, _ = sft_nll(policy, part, temperature)
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
        logprobs, values, _ = token_logprobs(policy, part, temperature, share_prompts=False)   # x, d per episode
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
    scores = []
    for f in forwards:
        _episode_loss_backward(policy, f, old_logprobs, advantages, clip_eps)
        scores.append(_contract(policy, f, g_val))
        f.seen = None                                                                # x and d: no longer needed
    return torch.cat(scores)


def batch_reference_scores(policy, forwards: list[ScoringForward], old_logprobs: torch.Tensor,
                           advantages: torch.Tensor, *, clip_eps: float, leave_one_out: bool,
                           reduce_sum=lambda x: x, n_total: int | None = None) -> torch.Tensor:
    """DTV's scores from the same forwards: s_i = g_i . r with r = (1/N) sum_j g_j, or with
    leave_one_out r_i = (sum_j g_j - g_i) / (N - 1), so s_i = (g_i . S - |g_i|^2) / (N - 1).
    The backward of sum_j L_j that records d also returns S = sum_j g_j as the parameters'
    gradient: no backward beyond the scoring's own. Every forward's x and d are kept until S is
    complete. |g_i|^2 is formed per layer from episode i's gradient slices
    (dL_i/dB = s d_i^T u_i, dL_i/dA = s (d_i B)^T x_i; (n, out, r) and (n, r, in) at a time).
    Under torchrun `reduce_sum` sums S over ranks and `n_total` is N over all ranks.
    Returns (n,) fp32 in the forwards' order."""
    total = None
    for f in forwards:
        g = _episode_loss_backward(policy, f, old_logprobs, advantages, clip_eps)
        total = g if total is None else total + g
    total = reduce_sum(total)
    n = sum(len(f.index) for f in forwards) if n_total is None else n_total
    scores = []
    for f in forwards:
        dots = _contract(policy, f, total)
        if leave_one_out:
            scores.append((dots.double() - _squared_norms(policy, f)) / max(n - 1, 1))
        else:
            scores.append(dots.double() / n)
        f.seen = None
    return torch.cat(scores).float()


def loop_reference_scores(episode_grads: torch.Tensor, *, leave_one_out: bool, reduce_sum=lambda x: x,
                          n_total: int | None = None) -> torch.Tensor:
    """DTV's scores from per-episode gradients (N, P): the readable reference of
    batch_reference_scores (the same arguments, the same result; tested)."""
    grads = episode_grads.double()
    total = reduce_sum(grads.sum(0))
    n = len(grads) if n_total is None else n_total
    if leave_one_out:
        return ((grads @ total - (grads * grads).sum(-1)) / max(n - 1, 1)).float()
    return (grads @ total / n).float()


def _episode_loss_backward(policy, f: ScoringForward, old_logprobs, advantages, clip_eps: float) -> torch.Tensor:
    """The backward of the forward's summed policy loss sum_i L_i: fills d in f.seen and frees
    the graph. Returns the parameters' gradient, sum_i g_i over its episodes, flat (P,)."""
    params = lora_parameters(policy)
    idx = f.index.to(advantages.device)
    loss = policy_loss(f.logprobs, old_logprobs[idx], advantages[idx], f.mask, clip_eps).sum()
    return _flat(torch.autograd.grad(loss, params, allow_unused=True), params)


def _lora_slices(policy, vector: torch.Tensor) -> list:
    """A flat (P,) vector laid out as lora_parameters (A, B of each layer in order), cut into
    one (V_A, V_B) pair per LoRA layer."""
    slices, offset = [], 0
    for layer in (m for m in policy.modules() if isinstance(m, LoRALinear)):
        a, b = layer.lora_A.numel(), layer.lora_B.numel()
        slices.append((vector[offset:offset + a].view_as(layer.lora_A),
                       vector[offset + a:offset + a + b].view_as(layer.lora_B)))
        offset += a + b
    return slices


@torch.no_grad()
def _contract(policy, f: ScoringForward, vector: torch.Tensor) -> torch.Tensor:
    """g_i . vector for the forward's episodes from its recorded x and d. (n,) float64."""
    layers = [m for m in policy.modules() if isinstance(m, LoRALinear)]
    part_scores = torch.zeros(len(f.index), device=vector.device, dtype=torch.float64)
    # Per layer, both terms in two matmuls: x [A; V_A]^T = [u, V_A x] and d [V_B, B] = [V_B^T d, B^T d],
    # so their elementwise product summed over the last dim is d^T V_B u + (B^T d)^T V_A x.
    # The matmuls run in the adapters' dtype (fp32); the sums over positions and layers (~10^5 terms of both signs
    # per episode) are accumulated in float64.
    for k, (layer, (V_A, V_B)) in enumerate(zip(layers, _lora_slices(policy, vector))):
        dtype = layer.lora_A.dtype  # fp32 (LoRA weights always are), fp64 in the benchmark's check
        if f.seen[k][1] is None:    # the layer ran but the loss does not depend on it: adds 0
            continue
        x, d = f.seen[k][0].to(dtype), f.seen[k][1].to(dtype)                     # (n, L, in), (n, L, out)
        left = x @ torch.cat([layer.lora_A, V_A.to(dtype)]).T                    # (n, L, 2r)
        right = d @ torch.cat([V_B.to(dtype), layer.lora_B], dim=1)              # (n, L, 2r)
        per_position = (left * right).sum(-1)                                    # (n, L)
        part_scores += layer.scale * per_position.double().sum(-1)               # sum over positions
    return part_scores


@torch.no_grad()
def _squared_norms(policy, f: ScoringForward) -> torch.Tensor:
    """|g_i|^2 for the forward's episodes from its recorded x and d, (n,) float64."""
    layers = [m for m in policy.modules() if isinstance(m, LoRALinear)]
    norms = torch.zeros(len(f.index), dtype=torch.float64, device=layers[0].lora_A.device)
    for k, layer in enumerate(layers):
        if f.seen[k][1] is None:
            continue
        dtype = layer.lora_A.dtype
        x, d = f.seen[k][0].to(dtype), f.seen[k][1].to(dtype)                     # (n, L, in), (n, L, out)
        grad_B = layer.scale * torch.einsum("nlo,nlr->nor", d, x @ layer.lora_A.T)  # (n, out, r)
        grad_A = layer.scale * torch.einsum("nlr,nli->nri", d @ layer.lora_B, x)    # (n, r, in)
        norms += grad_B.double().square().sum((1, 2)) + grad_A.double().square().sum((1, 2))
    return norms


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


def dtv_filter(scores: torch.Tensor):
    """--reference batch | batch-loo: DTV keeps the episodes whose gradient does not oppose the
    batch's (s_i >= 0), each weighted 1; it does not reweight."""
    keep = scores >= 0
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
