"""The exact speed-ups: the same numbers as the definitions, from less work.

The concept files compute every step by its definition: per-episode gradients by a loop of
backward passes (influence.episode_gradients), log-probs by log_softmax and gather over the
full logits (model.Policy.token_logprobs), one forward per sequence
(model.Policy.response_hidden_states), pi_old and V_old from their own no-grad pass
(rollout.generate_rollouts). This file holds the faster ways to get the same numbers, each
with its derivation and each tested equal to the definition it replaces. One switch chooses:

    --speedups off   the definitions, as the concept files read
    --speedups on    (the default) the lean log-probs, the shared prompt prefix and the
                     one-pass influence scores: less time and memory, nothing else changes
    --speedups all   also reuse a forward at theta_old for pi_old and V_old (more memory)

The speed-ups, in the order a forward meets them:

  shared prompt prefix   shared_prompt_hidden_states: the samples of one prompt share its
                         forward (tests/test_logprobs.py)
  similar lengths        length_batches: g_val's solutions in batches of similar lengths
  lean log-probs         TargetLogProb: the LM head only at response tokens, its logits
                         recomputed in the backward, never (N, T, vocabulary) in memory
                         (tests/test_logprobs.py)
  one-pass scores        onepass_scores: every s_i = g_i . g_val from one forward and backward,
                         no per-episode gradient formed (tests/test_influence.py); DTV's batch
                         reference from the same pass (onepass_batch_scores,
                         tests/test_confounds.py)
  theta_old reuse        theta_old_forwards: log pi_old and V_old from a forward at theta_old
                         that runs anyway, the scoring's or the update's first
                         (tests/test_passes.py)

Passes, at the end, is the switch: train.Definitions' passes (the definitions, --speedups off)
computed with these instead; train.passes_for picks one per iteration, so the algorithm box in
train.py has no branch per speed-up. docs/shortcuts.md gives what each saves;
bench/ippo_cost.py and bench/logprob_cost.py time them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import influence
from model import LoRALinear, flat_gradient, lora_parameters, trim_left_padding
from ppo import policy_loss
from rollout import old_and_ref_logprobs


# ----------------------------------------------------------------------------- log-probs

def token_logprobs(policy, seqs, temperature: float = 1.0, with_entropy: bool = False, share_prompts: bool = True):
    """rollout.token_logprobs (the same arguments and the same numbers) with the shared prompt
    prefix (unless `share_prompts` is False: the influence scoring needs one row per episode)
    and the lean log-probs (unless the model soft-caps its logits, which TargetLogProb does not)."""
    mask = seqs.response_mask
    if share_prompts:
        hidden = shared_prompt_hidden_states(policy, seqs.prompt_ids, seqs.prompt_mask, seqs.response_ids, mask)
    else:
        hidden = policy.response_hidden_states(seqs.prompt_ids, seqs.prompt_mask, seqs.response_ids, mask)
    values = policy.value(hidden) * mask                                             # (N, T)
    if policy.softcap is not None:
        logprobs, entropy = policy.token_logprobs(hidden, seqs.response_ids, temperature, with_entropy)
        return logprobs * mask, values, None if entropy is None else entropy * mask
    where = mask.bool()
    weight = policy.lm.get_output_embeddings().weight                                 # (V, H), frozen
    lp, ent = TargetLogProb.apply(hidden[where], weight, seqs.response_ids[where], temperature, with_entropy)
    logprobs = torch.zeros_like(mask).masked_scatter(where, lp)                       # (N, T)
    entropy = torch.zeros_like(mask).masked_scatter(where, ent) if with_entropy else None
    return logprobs, values, entropy


def shared_prompt_hidden_states(policy, prompt_ids, prompt_mask, response_ids, response_mask) -> torch.Tensor:
    """policy.response_hidden_states with the samples of one prompt sharing its forward, (N, T, H).

    Under causal attention a prompt's states do not depend on what follows it, so rows whose
    prompts are equal can run the prompt once: its keys and values are computed once, copied to
    each of its rows for the responses' forward, and the backward sums what the rows send back
    to it. The same numbers and gradients as one forward per row, with the prompt's tokens
    computed once instead of once per sample. rollout.sample shares the prefill the same way.
    Where no two prompts are equal it is the one forward per row."""
    prompt_ids, prompt_mask = trim_left_padding(prompt_ids, prompt_mask)
    T = response_ids.shape[1]
    rows = torch.cat([prompt_ids, prompt_mask.long()], dim=1)
    unique, row_of = torch.unique(rows, dim=0, return_inverse=True)           # U distinct prompts
    if len(unique) == len(rows):
        return policy.response_hidden_states(prompt_ids, prompt_mask, response_ids, response_mask)
    from transformers import DynamicCache
    ids, mask = unique[:, :prompt_ids.shape[1]], unique[:, prompt_ids.shape[1]:]
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    decoder, cache = policy.lm.get_decoder(), DynamicCache()
    prompts = decoder(input_ids=ids, attention_mask=mask, position_ids=position, cache=cache, use_cache=True)
    cache.reorder_cache(row_of)                                                 # U prompts -> N rows
    position = position[row_of, -1:] + 1 + torch.arange(T, device=ids.device)  # (N, T)
    attention_mask = torch.cat([mask[row_of], response_mask.long()], dim=1)
    responses = decoder(input_ids=response_ids, attention_mask=attention_mask, position_ids=position,
                        cache=cache, use_cache=True)
    # The prompt's last position predicts response token 0; response position t predicts t + 1.
    return torch.cat([prompts.last_hidden_state[row_of, -1:], responses.last_hidden_state[:, :-1]], dim=1)


LOGIT_CHUNK = 256  # positions per LM-head chunk: peak extra memory is 3 x 256 x vocab floats


class TargetLogProb(torch.autograd.Function):
    """For M hidden states h (M, H), a frozen LM head W (V, H) and targets a (M,):
        z = h W^T / temperature,  log p(a) = z_a - logsumexp(z),  H = -sum_k p_k log p_k.
    Computed LOGIT_CHUNK rows at a time; backward recomputes z per chunk, using
        d log p(a) / dz = onehot(a) - p,   dH / dz = -p (log p + H),   dh = (dz / temperature) W.
    The entropy is computed only `with_entropy` (else returned as None), and its gradient term
    only when the loss uses it: each is several passes over a (chunk, vocabulary) block, and
    the LM head is most of a small model's cost per response token. The (chunk, vocabulary)
    blocks are updated in place where that gives the same numbers bit for bit."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy):
        if weight.requires_grad:
            raise ValueError("TargetLogProb assumes a frozen LM head (it returns no weight gradient)")
        logp = torch.empty(len(targets), device=hidden.device)
        entropy = torch.empty(len(targets), device=hidden.device) if with_entropy else None
        for s in range(0, len(targets), LOGIT_CHUNK):
            e = s + LOGIT_CHUNK
            logq = torch.log_softmax((hidden[s:e] @ weight.T).float().div_(temperature), dim=-1)   # (c, V)
            logp[s:e] = logq.gather(-1, targets[s:e, None]).squeeze(-1)
            if with_entropy:
                entropy[s:e] = -(logq.exp() * logq).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)   # an output the loss does not use: its gradient is None, not zeros
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, entropy = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden)
        for s in range(0, len(targets), LOGIT_CHUNK):
            e = s + LOGIT_CHUNK
            logq = torch.log_softmax((hidden[s:e] @ weight.T).float().div_(ctx.temperature), dim=-1)   # (c, V)
            if grad_entropy is None:                        # log p(a) only: -p g + onehot(a) g, in place
                grad_z = logq.exp_().mul_(-grad_logp[s:e, None])
                grad_z.scatter_add_(-1, targets[s:e, None], grad_logp[s:e, None])
            else:
                p = logq.exp()
                grad_z = torch.zeros_like(p)
                if grad_logp is not None:
                    grad_z -= p * grad_logp[s:e, None]
                    grad_z.scatter_add_(-1, targets[s:e, None], grad_logp[s:e, None])
                grad_z -= grad_entropy[s:e, None] * p * (logq + entropy[s:e, None])
            grad_hidden[s:e] = (grad_z.div_(ctx.temperature).to(weight.dtype) @ weight).to(hidden.dtype)
        return grad_hidden, None, None, None, None



def length_batches(seqs, batch_size: int) -> list:
    """`seqs` in batches of `batch_size` sequences of similar lengths, each cut to the response
    columns it uses: the set is padded to its longest prompt and response, and a batch of
    shorter ones need not pay for that padding (the prompt side is cut in
    model.Policy.response_hidden_states). Every sequence once: a sum over the batches is the
    sum over the set."""
    order = (seqs.prompt_mask.sum(1) * 1000 + seqs.response_mask.sum(1)).cpu().argsort(stable=True)
    batches = []
    for s in range(0, len(seqs), batch_size):
        part = seqs.select(order[s:s + batch_size])
        width = int(part.response_mask.sum(1).max())
        batches.append(type(part)(part.prompt_ids, part.prompt_mask, part.response_ids[:, :width],
                                  part.response_mask[:, :width]))
    return batches


# ----------------------------------------------------------------------------- one-pass scores

def onepass_scores(policy, rollouts, advantages: torch.Tensor, g_val: torch.Tensor, *, clip_eps: float,
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
    Returns (N,) fp32; equal to influence.influence_scores(influence.episode_gradients(...), g_val)
    (tests/test_influence.py).

    Each batch is one scoring_forward (the forward at theta_old, recording x) followed by its
    scoring_backward. Under --speedups all (theta_old_forwards) all the forwards run first and
    the old log-probs and values come from them, then the backwards."""
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


def scoring_forward(policy, part, temperature: float) -> ScoringForward:
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


def onepass_batch_scores(policy, forwards: list[ScoringForward], old_logprobs: torch.Tensor,
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
    grad_sum = None
    for f in forwards:
        g = _episode_loss_backward(policy, f, old_logprobs, advantages, clip_eps)
        grad_sum = g if grad_sum is None else grad_sum + g
    grad_sum = reduce_sum(grad_sum)
    n = sum(len(f.index) for f in forwards) if n_total is None else n_total
    scores = []
    for f in forwards:
        dots = _contract(policy, f, grad_sum)
        if leave_one_out:
            scores.append((dots.double() - _squared_norms(policy, f)) / max(n - 1, 1))
        else:
            scores.append(dots.double() / n)
        f.seen = None
    return torch.cat(scores).float()


def _episode_loss_backward(policy, f: ScoringForward, old_logprobs, advantages, clip_eps: float) -> torch.Tensor:
    """The backward of the forward's summed policy loss sum_i L_i: fills d in f.seen and frees
    the graph. Returns the parameters' gradient, sum_i g_i over its episodes, flat (P,)."""
    params = lora_parameters(policy)
    idx = f.index.to(advantages.device)
    loss = policy_loss(f.logprobs, old_logprobs[idx], advantages[idx], f.mask, clip_eps).sum()
    return flat_gradient(torch.autograd.grad(loss, params, allow_unused=True), params)


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
        raise SystemExit(f"--speedups on: the one-pass scores assume every LoRA layer runs exactly once per forward pass; "
                         f"in this model {', '.join(wrong)}. Use --speedups off (per-episode gradients "
                         "by autograd, correct for any model).")



# ----------------------------------------------------------------------------- theta_old reuse
#
# With --speedups all, log pi_old and V_old are not computed by a no-grad pass of their own
# where a forward at theta_old that runs anyway gives the same numbers. That forward keeps its
# graph; the rewards and advantages are made from its detached outputs; then its backward runs.
# With influence on it is the scoring's forward, and its backward gives the scores; with
# influence off and one minibatch of every episode, it is the update's first forward, and its
# backward is the first optimizer step's (at theta_old, where the ratio is 1).
# tests/test_passes.py checks that a run is the same either way; the price is memory: every
# episode's graph is kept until its backward.

@dataclass
class UpdateForward:
    """The update's first forward over some episodes, run ahead of the advantages (graphs kept)."""
    index: torch.Tensor      # (n,) which episodes of the batch
    logprobs: torch.Tensor   # (n, T) log pi_theta at theta_old
    values: torch.Tensor     # (n, T) V_theta at theta_old
    entropy: torch.Tensor    # (n, T)


def theta_old_forwards(policy, rollouts, order: torch.Tensor, *, batch_size: int, temperature: float,
                       scoring: bool, ref: bool) -> list:
    """The forward at theta_old over the episodes `order`, `batch_size` at a time, graphs kept:
    the influence scoring's (scoring_forward, which records each LoRA layer's input) if
    `scoring`, else the update's first (an UpdateForward per micro-batch, `order` being the first
    minibatch's, so that the first step sums its micro-batches exactly as train.ppo_update would).
    Sets rollouts.old_logprobs and rollouts.values from their detached outputs: the numbers the
    separate no-grad pass would give. With `ref` (--kl-beta > 0) it also sets
    rollouts.ref_logprobs, adapters off, over the same micro-batches: log pi_old - log pi_ref is
    then exactly 0 where the adapters equal the reference (iteration 1), as in the separate pass,
    not rounding noise from batches of other shapes (which the whitening would blow up into
    advantages, and the filter into kept episodes, when every reward is equal)."""
    from model import adapters_disabled
    forwards, refs = [], []
    for index in order.split(batch_size):
        part = rollouts.select(index)
        if ref:   # in the forward's own shape (the scoring's shares no prompt), as said above
            with torch.no_grad(), adapters_disabled(policy):
                refs.append(token_logprobs(policy, part, temperature, share_prompts=not scoring)[0])
        if scoring:
            forward = scoring_forward(policy, part, temperature)
            forward.index = index
        else:
            forward = UpdateForward(index, *token_logprobs(policy, part, temperature, with_entropy=True))
        forwards.append(forward)
    index = torch.cat([f.index for f in forwards]).to(rollouts.response_mask.device)
    rollouts.old_logprobs = torch.zeros_like(rollouts.response_mask).index_copy(
        0, index, torch.cat([f.logprobs.detach() for f in forwards]))                   # (N, T)
    rollouts.values = torch.zeros_like(rollouts.response_mask).index_copy(
        0, index, torch.cat([f.values.detach() for f in forwards]))                     # (N, T)
    if refs:
        rollouts.ref_logprobs = torch.zeros_like(rollouts.response_mask).index_copy(0, index, torch.cat(refs))
    return forwards


# ----------------------------------------------------------------------------- the switch

class Passes:
    """train.Definitions' passes with the speed-ups above: the same numbers from less work.
    --speedups on: the lean log-probs and the shared prompt prefix wherever log-probs are taken,
    g_val's solutions in batches of similar lengths, the one-pass scores (and DTV's batch
    reference from one pass). --speedups all also takes pi_old and V_old from a forward at
    theta_old that a later phase runs anyway (theta_old_forwards): the scoring's with influence
    on, or with influence off and one minibatch of every episode the update's first; kept here
    until that phase takes it over. `first_minibatch(every)`: the episodes of the update's first
    minibatch (train.minibatch_plan's), in its order."""

    def __init__(self, cfg, first_minibatch):
        self.cfg, self.first_minibatch = cfg, first_minibatch
        self.scoring = self.update = None   # forwards at theta_old run ahead (--speedups all)

    def old_policy(self, policy, rollouts, timer):
        cfg = self.cfg
        one_minibatch = cfg.minibatch_size >= cfg.prompts_per_iter * cfg.samples_per_prompt
        reuse = "scoring" if cfg.influence == "on" else "update" if one_minibatch else None
        if cfg.speedups != "all" or reuse is None:
            with timer("rollout"):
                rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
                    policy, rollouts, cfg.temperature, cfg.gen_batch_size, ref=cfg.kl_beta > 0, logprobs=token_logprobs)
            return
        with timer("shared_forward"):
            order = torch.arange(len(rollouts))
            if reuse == "update":   # every episode is kept (no influence): the first minibatch holds them all
                order = self.first_minibatch(torch.ones(len(rollouts), dtype=torch.bool, device=rollouts.response_mask.device))
            setattr(self, reuse, theta_old_forwards(policy, rollouts, order, batch_size=cfg.micro_batch_size,
                                                    temperature=cfg.temperature, scoring=reuse == "scoring",
                                                    ref=cfg.kl_beta > 0))

    def validation_gradient(self, policy, val_seqs, n_tokens):
        cfg = self.cfg
        return influence.validation_gradient(policy, val_seqs, cfg.val_batch_size, cfg.progress, n_tokens,
                                             temperature=cfg.temperature, batches=length_batches(val_seqs, cfg.val_batch_size),
                                             logprobs=token_logprobs)

    def scores(self, policy, rollouts, advantages, g_val):
        if self.scoring is not None:   # the scoring forward already ran (--speedups all)
            return scoring_backward(policy, self.scoring, rollouts.old_logprobs, advantages, g_val, clip_eps=self.cfg.clip_eps)
        return onepass_scores(policy, rollouts, advantages, g_val, clip_eps=self.cfg.clip_eps,
                              temperature=self.cfg.temperature, batch_size=self.cfg.micro_batch_size)

    def batch_scores(self, policy, rollouts, advantages, **reference):
        forwards = self.scoring
        if forwards is None:   # every forward first: the reference needs all episodes' gradients
            forwards = []
            for index in _chunks(torch.arange(len(rollouts)), self.cfg.micro_batch_size):
                forwards.append(scoring_forward(policy, rollouts.select(index), self.cfg.temperature))
                forwards[-1].index = index
        return onepass_batch_scores(policy, forwards, rollouts.old_logprobs, advantages, clip_eps=self.cfg.clip_eps,
                                      **reference)

    def update_forwards(self, policy, rollouts, minibatch, step):
        if step == 0 and self.update is not None:   # the first step's forward ran at theta_old (--speedups all)
            return ((f.index, f.logprobs, f.values, f.entropy) for f in self.update)
        return ((micro, *token_logprobs(policy, rollouts.select(micro), self.cfg.temperature, with_entropy=True))
                for micro in _chunks(minibatch, self.cfg.micro_batch_size))

    def sft_nll(self, policy, seqs):
        return influence.sft_nll(policy, seqs, logprobs=token_logprobs)


def _chunks(index: torch.Tensor, size: int) -> list:
    return [index[s:s + size] for s in range(0, len(index), size)]
