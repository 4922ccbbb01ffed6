"""I-PPO: Influence-Guided PPO post-training of an LLM on math word problems.

Shu, Zhang, Hullman, "Learning from the Right Rollouts: Data Attribution for PPO-based LLM
Post-Training", arXiv 2604.01597. One iteration (the algorithm box, `ppo_iteration` below):

    rollout     sample n responses per prompt from pi_theta                 rollout.py
    reward      R_i = exact match of the final answer                      reward.py
    advantages  r_t = -beta (log pi - log pi_ref) + R_i at the last token;
                A_t, R_t = GAE(gamma, lambda); A whitened over tokens       ppo.py
                (--advantage grpo: (r_i - mean) / std over a prompt's samples)
    influence   s_i = grad L_clip_i . grad L_SFT(val); keep s_i > 0;
                w_i = s_i / mean_kept s                                    influence.py
    update      PPO epochs on the kept episodes D', per minibatch M of D':
                (1/|M|) sum_{i in M} [w_i L_clip_i + c_v L_V_i - c_e H_i]        ppo.py

`--influence off` is plain PPO; `--algo sft` trains the adapters on reference solutions.
The settings and their checks are in config.py, the data and prompts in data.py, the run
directory (crash-safe commits, checkpoints, resume) in rundir.py. Faults: a crash at any moment
loses no committed iteration and --resume continues exactly; a NaN/inf stops the run naming
the phase, before anything of that iteration is saved; nonsense flags are refused at start,
naming the flag. Run `python train.py --help` for every flag; the README explains the output.

Public: main(argv) -> run directory; the phases ppo_iteration, compute_advantages,
select_episodes, ppo_update, sft_iteration (each takes `dist`, see distributed.py; tests call
them under torchrun); make_optimizer, planted_flips, noise_metrics, run_eval.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm import tqdm

from config import Config, check_against_data, check_against_model, check_against_world, parse_config
from data import load_task, make_prompt
from distributed import Dist
from distributed import setup as setup_distributed
from evaluate import evaluate
from influence import (binary_filter, detection_auc, dtv_filter, episode_gradients, filter_and_reweight,
                       influence_scores, loop_reference_scores, random_filter, sft_nll, validation_gradient)
from model import adapters_disabled, inspect_model, load_adapter, load_policy, load_reference_adapter
from ppo import (approx_kl, clip_fraction, explained_variance, gae, group_advantages, kl_penalized_rewards, masked_mean,
                 policy_loss, value_loss, whiten)
from report import write_plots, write_report
from reasoning import LABELS
from reasoning import label as reasoning_label
from reward import extract_answer, is_correct, reward_fn
from rollout import Rollouts, encode_pairs, generate_rollouts, token_logprobs
from speedups import (batch_reference_scores, onepass_scores, reused_forward, scoring_backward, scoring_forward,
                      theta_old_forwards)
from rundir import (append_jsonl, commit_iteration, last_good_checkpoint_on_fault, latest_checkpoint, open_run_dir,
                    pin_init_adapter, resolve_checkpoint, restore_run, unlock_run_dir, write_atomic)

SINGLE = Dist()  # one process: every collective of distributed.py is the identity
SAMPLING, FILTER, SHUFFLE, MINIBATCHES, NOISE, SFT_ROWS = 1, 2, 3, 4, 5, 6   # the purposes of derived_seed's draws


# ----------------------------------------------------------------------------- the algorithm
#
# Under torchrun (distributed.py) each rank runs these functions on its share of the prompts;
# every sum, mean or selection that the algorithm box defines over the whole batch goes through
# `dist`, so K ranks compute the update of one process holding all K shares. In one process
# `dist` is SINGLE and those calls do nothing.

def ppo_iteration(it: int, cfg: Config, policy, tokenizer, optimizer, train_examples, val_seqs, timer,
                  dist: Dist = SINGLE) -> tuple[dict, list]:
    """One I-PPO iteration, the algorithm box of the paper. Returns (metrics, episode records),
    both over all ranks' episodes."""
    examples = [train_examples[i] for i in batch_indices(len(train_examples), it, cfg.prompts_per_iter, cfg.seed)]
    examples = examples[slice(*dist.share(len(examples)))]  # this rank's prompts (all of them in one process)

    reuse = reused_forward(cfg.speedups, cfg.influence == "on", one_minibatch(cfg))   # None unless --speedups all
    with timer("rollout"):   # the samples, then log pi_old, V_old (and log pi_ref at beta > 0) in a no-grad pass
        rollouts = generate_rollouts(policy, tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                                     n_samples=cfg.samples_per_prompt, max_new_tokens=cfg.max_new_tokens,
                                     temperature=cfg.temperature, seed=derived_seed(cfg.seed, it, SAMPLING, dist.rank),
                                     batch_size=cfg.gen_batch_size, progress=cfg.progress, fast=cfg.speedups != "off",
                                     old=reuse is None, reference=cfg.kl_beta > 0 and reuse is None)
        golds = [examples[j].gold for j in rollouts.prompt_index]
    forwards = reuse and reused_forwards(it, cfg, policy, rollouts, reuse, timer, dist)   # --speedups all
    require_finite(it, "rollout", old_logprobs=rollouts.old_logprobs, values=rollouts.values,
                   ref_logprobs=rollouts.ref_logprobs)
    drift = sampler_drift(rollouts, next(policy.lm.parameters()).dtype, dist)   # the sampler's log-probs vs pi_old

    buf = Buffer(examples, rollouts)   # the iteration's data; each phase below adds its part

    with timer("reward"):
        buf.flipped = planted_flips(cfg, it, len(rollouts), dist.rank)                   # (N,) bools
        buf.rewards = torch.tensor([reward_fn(text, gold, cfg.dataset, bool(trunc), cfg.truncation_penalty, flip)
                                    for text, gold, trunc, flip in zip(rollouts.responses, golds, rollouts.truncated,
                                                                       buf.flipped)],
                                   device=rollouts.response_mask.device)                 # (N,)
        require_finite(it, "reward", rewards=buf.rewards)

    with timer("advantages"):
        buf.advantages, buf.returns, buf.kl, critic = compute_advantages(cfg, buf, dist)  # (N, T) each

    with timer("influence"):
        buf.keep, buf.weights, influence = select_episodes(it, cfg, policy, buf, val_seqs, dist,
                                                            forwards if reuse == "scoring" else None)
        n_kept = int(dist.sum(buf.keep.sum()))                                           # |D'| over all ranks
        if cfg.rewhiten_kept and n_kept > 0:   # the kept set's w-weighted mean advantage back to 0
            buf.advantages = whiten(buf.advantages, buf.rollouts.response_mask, reduce_sum=dist.sum,
                                    std_floor=cfg.adv_std_floor, weights=buf.weights * buf.keep)

    with timer("update"):
        if n_kept > 0:
            update = ppo_update(it, cfg, policy, optimizer, buf, dist,
                                first_forwards=forwards if reuse == "update" else None, sft_seqs=val_seqs)
        else:
            update = {"skipped": True}

    return iteration_records(it, cfg, buf, n_kept, influence | critic | drift, update, dist)


@dataclasses.dataclass
class Buffer:
    """One iteration's data, in one place. ppo_iteration makes it from the rollouts and each
    phase adds its part: the reward phase `flipped` and `rewards`, compute_advantages
    `advantages`, `returns` and `kl`, select_episodes `keep` and `weights`; ppo_update and
    iteration_records read it. Every tensor is over this rank's N episodes."""
    examples: list                          # the prompts' examples (data.Example)
    rollouts: Rollouts                      # tokens, masks, log pi_old, V_old, log pi_ref, sampler log-probs
    flipped: list | None = None             # (N,) bool: reward flipped by --reward-noise
    rewards: torch.Tensor | None = None     # (N,) the task reward R_i (exact match, after any flip)
    advantages: torch.Tensor | None = None  # (N, T) A_t
    returns: torch.Tensor | None = None     # (N, T) R_t, the value targets (zeros under GRPO)
    kl: torch.Tensor | None = None          # (N, T) log pi_old - log pi_ref (None at --kl-beta 0)
    keep: torch.Tensor | None = None        # (N,) bool: in D', the episodes the update learns from
    weights: torch.Tensor | None = None     # (N,) w_i (1 for every kept episode but under reweighting)


def compute_advantages(cfg: Config, buf: Buffer, dist: Dist = SINGLE):
    """Reads buf.rollouts and buf.rewards.
    r_t = -beta (log pi_old - log pi_ref) + the task reward R_i at the last token (ppo.kl_penalized_rewards);
    A_t, R_t = GAE(gamma, lambda) (ppo.gae); A whitened over the response tokens of the whole
    batch, all ranks', its std floored at --adv-std-floor (ppo.whiten). Returns (advantages,
    returns, kl), each (N, T) (kl None at --kl-beta 0, where pi_ref is not computed), and the
    critic's health: the mean advantage before whitening (over all response tokens) and the
    explained variance of V_old against the returns.
    With --advantage grpo: ppo.group_advantages of the episodes' summed rewards on every token,
    not whitened, no returns (zeros) and no critic."""
    rollouts, mask = buf.rollouts, buf.rollouts.response_mask
    token_rewards, kl = kl_penalized_rewards(buf.rewards, rollouts.old_logprobs, rollouts.ref_logprobs, mask, cfg.kl_beta)
    if cfg.advantage == "grpo":
        # Our choice: the KL penalty enters GRPO as the episode's summed per-token reward (the
        # same total as PPO's), before the group normalisation.
        group_adv = group_advantages(token_rewards.sum(-1), torch.as_tensor(rollouts.prompt_index, device=mask.device))
        advantages, returns = group_adv[:, None] * mask, torch.zeros_like(mask)              # (N, T)
        ev = float("nan")                                                                 # no critic
    else:
        advantages, returns = gae(token_rewards, rollouts.values, mask, cfg.gamma, cfg.lam)
        ev = explained_variance(rollouts.values, returns, mask, reduce_sum=dist.sum)
    n_tokens = dist.sum(mask.sum()).clamp(min=1.0)
    critic = {"advantage_mean": (dist.sum((advantages * mask).sum()) / n_tokens).item(),
              "explained_variance": None if math.isnan(ev) else ev}     # None: no critic, or constant returns
    if cfg.advantage == "gae":
        advantages = whiten(advantages, mask, reduce_sum=dist.sum, std_floor=cfg.adv_std_floor)
    return advantages, returns, kl, critic


def select_episodes(it, cfg: Config, policy, buf: Buffer, val_seqs, dist: Dist = SINGLE, forwards=None):
    """Influence scores at theta_old and the kept set D' with its weights, from buf.rollouts and
    buf.advantages (`forwards`: the scoring forwards already run, --speedups all; their
    backwards give the scores).
    Returns (keep (N,) bool, weights (N,), metrics dict) for this rank's episodes; the filter
    and the weight normalisation (mean score over the kept episodes) see all ranks' scores."""
    rollouts, advantages, N = buf.rollouts, buf.advantages, len(buf.rollouts)
    if cfg.influence == "off":  # plain PPO: every episode, weight 1
        return torch.ones(N, dtype=torch.bool, device=advantages.device), torch.ones(N, device=advantages.device), {}
    if cfg.reference == "validation":
        scores, g_val = validation_scores(it, cfg, policy, rollouts, advantages, val_seqs, dist, forwards)
    else:
        scores, g_val = batch_scores(cfg, policy, rollouts, advantages, dist, forwards), None
    all_scores = dist.cat(scores)                                                                     # (N_all,)
    require_finite(it, "influence", scores=all_scores)
    if cfg.random_filter:
        keep, weights = random_filter(all_scores, torch.Generator().manual_seed(derived_seed(cfg.seed, it, FILTER)))
    elif cfg.reference != "validation":
        keep, weights = dtv_filter(all_scores)
    elif cfg.reweight:
        keep, weights = filter_and_reweight(all_scores)
    else:
        keep, weights = binary_filter(all_scores)
    mine = slice(dist.offset(N), dist.offset(N) + N)  # this rank's episodes within all_scores
    # The effective number of episodes behind the update (Kish): (sum w)^2 / sum w^2, |D'| when
    # every kept weight is 1, fewer when a few large scores carry the weight.
    ess = (weights.sum() ** 2 / (weights ** 2).sum()).item() if bool(keep.any()) else 0.0
    return keep[mine], weights[mine], {"weight_ess": ess,
        "score_mean": all_scores.mean().item(), "score_min": all_scores.min().item(),
        "score_max": all_scores.max().item(), "positive_fraction": (all_scores > 0).float().mean().item(),
        "g_val_norm": None if g_val is None else g_val.norm().item(), "scores": scores.tolist()}


def validation_scores(it, cfg: Config, policy, rollouts, advantages, val_seqs, dist: Dist = SINGLE, forwards=None):
    """I-PPO's s_i = g_i . g_val for this rank's episodes, and g_val. Both gradients are taken
    at the sampling temperature (our choice, influence.py's docstring says why)."""
    # g_val over the whole validation set: each rank's share divided by the token count of all shares, summed.
    n_val_tokens = dist.sum(val_seqs.response_mask.sum())
    g_val = dist.sum(validation_gradient(policy, val_seqs, cfg.val_batch_size, progress=cfg.progress,
                                         n_tokens=n_val_tokens, temperature=cfg.temperature,
                                         fast=cfg.speedups != "off"))                                  # (P,)
    require_finite(it, "influence", g_val=g_val)
    if cfg.speedups == "off":   # the definition: g_i by a backward per episode
        grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps,
                                  temperature=cfg.temperature, progress=cfg.progress)                # (N, P)
        return influence_scores(grads, g_val), g_val                                                  # (N,)
    if forwards is not None:   # --speedups all: the scoring forward already ran (reused_forwards)
        return scoring_backward(policy, forwards, rollouts.old_logprobs, advantages, g_val, clip_eps=cfg.clip_eps), g_val
    return onepass_scores(policy, rollouts, advantages, g_val, clip_eps=cfg.clip_eps,
                          temperature=cfg.temperature, batch_size=cfg.micro_batch_size), g_val       # (N,)


def batch_scores(cfg: Config, policy, rollouts, advantages, dist: Dist = SINGLE, forwards=None) -> torch.Tensor:
    """DTV's validation-free scores (--reference batch | batch-loo) for this rank's episodes:
    g_i . the mean gradient of all ranks' episodes (without episode i for batch-loo)."""
    loo, n_total = cfg.reference == "batch-loo", int(dist.sum(torch.tensor(float(len(rollouts)), device=advantages.device)))
    if cfg.speedups == "off":
        grads = episode_gradients(policy, rollouts, advantages, clip_eps=cfg.clip_eps,
                                  temperature=cfg.temperature, progress=cfg.progress)                # (N, P)
        return loop_reference_scores(grads, leave_one_out=loo, reduce_sum=dist.sum, n_total=n_total)
    if forwards is None:   # every forward first: the reference needs all episodes' gradients
        forwards = []
        for index in chunks(torch.arange(len(rollouts)), cfg.micro_batch_size):
            forwards.append(scoring_forward(policy, rollouts.select(index), cfg.temperature))
            forwards[-1].index = index
    return batch_reference_scores(policy, forwards, rollouts.old_logprobs, advantages, clip_eps=cfg.clip_eps,
                                  leave_one_out=loo, reduce_sum=dist.sum, n_total=n_total)


def ppo_update(it, cfg: Config, policy, optimizer, buf: Buffer, dist: Dist = SINGLE,
               first_forwards: list | None = None, sft_seqs=None) -> dict:
    """PPO epochs over the buffer (its rollouts, advantages, returns, keep and weights). Per
    optimizer step on a minibatch M:
        loss = (1/|M & D'|) sum_{i in M & D'} [ w_i L_clip_i - c_e H_i ]  +  c_v (1/|M & C|) sum_{i in M & C} L_V_i
    where D' is the kept episodes and C the critic's (--critic-episodes: all of them by default,
    or D'); per-episode losses are token means and the value loss is unweighted (our choices).
    Each epoch shuffles every episode of the buffer and splits them into
    ceil(N / --minibatch-size) minibatches of balanced sizes (our choice): every method takes
    the same number of optimizer steps, however many episodes its filter keeps. With
    --minibatch-size >= N this is exactly the objective of the algorithm box. Under torchrun
    every rank draws the same shuffle of all episodes, works on its own episodes of each
    minibatch, and the gradients are summed over ranks before the step, so K ranks take the
    steps one process would.
    `first_forwards` (--speedups all, reused_forwards): the first step's forward over every
    episode, already run at theta_old; only its backward is left.
    With --sft-coef c > 0 every step's loss also has c times the mean NLL of a batch of
    `sft_seqs`, the validation solutions (sft_term): the PPO-plus-SFT control."""
    rollouts, advantages, returns, keep, weights = buf.rollouts, buf.advantages, buf.returns, buf.keep, buf.weights
    device = advantages.device
    critic = cfg.advantage == "gae" and cfg.vf_coef > 0
    uses = keep if not critic or cfg.critic_episodes == "kept" else torch.ones_like(keep)   # (N,) whose forward counts
    value_on = uses if critic else torch.zeros_like(keep)                                   # (N,) in the value loss
    steps = minibatch_plan(it, cfg, keep, value_on, dist)
    n_minibatches = len(steps) // cfg.ppo_epochs
    params = [p for p in policy.parameters() if p.requires_grad]
    sums = {"policy_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "policy_visits": 0.0,
            "value_loss": 0.0, "value_visits": 0.0}
    sft_losses, grad_norms = [], []
    # pi_theta / pi_old over the tokens of the first minibatch, before any step: 1 up to rounding
    # (anything else means the old log-probs are not those of the policy being updated).
    ratio_sum, ratio_count, ratio_max = 0.0, 0.0, 0.0
    if first_forwards is not None and (n_minibatches != 1 or not bool(keep.all())):
        raise RuntimeError("the update's first forward is run ahead only when one minibatch holds every episode")
    for step, (epoch, n_policy, n_value, minibatch) in enumerate(tqdm(steps, desc="updating", unit="step",
                                                                      disable=not cfg.progress, leave=False)):
        optimizer.zero_grad(set_to_none=True)
        minibatch = minibatch[uses[minibatch.to(device)].cpu()]   # skip episodes that add nothing
        if step == 0 and first_forwards is not None:   # every episode, forward already run at theta_old
            forwards = ((f.index, f.logprobs, f.values, f.entropy) for f in first_forwards)
        else:                                          # (n, T) each, one micro-batch at a time
            forwards = ((micro, *token_logprobs(policy, rollouts.select(micro), cfg.temperature, with_entropy=True,
                                                fast=cfg.speedups != "off"))
                        for micro in chunks(minibatch, cfg.micro_batch_size))
        for micro, logprobs, values, entropy in forwards:
            part = rollouts.select(micro)
            on_policy, on_value = keep[micro].float(), value_on[micro].float()          # (n,) each
            pg = policy_loss(logprobs, part.old_logprobs, advantages[micro], part.response_mask, cfg.clip_eps)  # (n,)
            vf = value_loss(values, part.values, returns[micro], part.response_mask, cfg.value_clip_eps)       # (n,)
            ent = masked_mean(entropy, part.response_mask)                                    # (n,)
            # At c_e = 0 the entropy (logged) stays out of the graph: no backward through it.
            bonus = cfg.ent_coef * (on_policy * ent).sum() if cfg.ent_coef else 0.0
            loss = ((weights[micro] * on_policy * pg).sum() - bonus) / max(n_policy, 1)
            if critic:
                loss = loss + cfg.vf_coef * (on_value * vf).sum() / max(n_value, 1)
            require_finite(it, f"update, epoch {epoch + 1}", loss=loss)
            loss.backward()
            sums["policy_loss"] += (on_policy * pg).sum().item()
            sums["entropy"] += (on_policy * ent).sum().item()
            sums["clip_fraction"] += (on_policy * clip_fraction(logprobs, part.old_logprobs, part.response_mask,
                                                                cfg.clip_eps)).sum().item()
            sums["approx_kl"] += (on_policy * approx_kl(logprobs.detach(), part.old_logprobs,
                                                        part.response_mask)).sum().item()
            sums["policy_visits"] += on_policy.sum().item()
            sums["value_loss"] += (on_value * vf).sum().item()
            sums["value_visits"] += on_value.sum().item()
            if step == 0:
                ratio = torch.exp(logprobs.detach() - part.old_logprobs)[part.response_mask.bool() & keep[micro, None]]
                ratio_sum, ratio_count = ratio_sum + ratio.sum().item(), ratio_count + ratio.numel()
                ratio_max = max(ratio_max, ratio.max().item() if ratio.numel() else 0.0)
        if cfg.sft_coef > 0:
            sft_losses.append(sft_term(it * len(steps) + step, cfg, policy, sft_seqs))
        dist.sum_grads(params)
        grad_norms.append(clip_and_step(it, cfg, policy, optimizer))
    # Reported: unweighted means over every visit of a kept episode (the value loss: of an
    # episode in the value loss) in every epoch, all ranks.
    total = dict(zip(sums, dist.sum(torch.tensor(list(sums.values()), dtype=torch.float64, device=device)).tolist()))
    policy_visits, value_visits = total.pop("policy_visits"), total.pop("value_visits")
    as_tensor = lambda *xs: torch.tensor(xs, dtype=torch.float64, device=device)  # noqa: E731
    ratio_sum, ratio_count = dist.sum(as_tensor(ratio_sum, ratio_count)).tolist()
    ratio_max = dist.cat(as_tensor(ratio_max)).max().item()                              # over ranks
    out = {k: v / max(policy_visits, 1.0) for k, v in total.items() if k != "value_loss"}
    return out | {"value_loss": total["value_loss"] / value_visits if value_visits else None,
                  "optimizer_steps": len(steps), "ratio_first_mean": ratio_sum / max(ratio_count, 1.0),
                  "ratio_first_max": ratio_max, "grad_norm_first": grad_norms[0],
                  **({"sft_loss": sum(sft_losses) / len(sft_losses)} if sft_losses else {})}


def sft_term(step: int, cfg: Config, policy, sft_seqs) -> float:
    """--sft-coef c: backward of c x (sum of NLL over a batch of --sft-batch-size validation
    solutions) / (their token count), at temperature 1 as in --algo sft; the batch is the
    `step`-th of the run over a seeded shuffle of the solutions. Returns the mean NLL."""
    rows = batch_indices(len(sft_seqs), step, cfg.sft_batch_size, cfg.seed, purpose=SFT_ROWS)
    nll, n_tokens = sft_nll(policy, sft_seqs.select(rows))
    loss = nll.sum() / n_tokens.sum()
    (cfg.sft_coef * loss).backward()
    return loss.item()


def minibatch_plan(it: int, cfg: Config, keep: torch.Tensor, value_on: torch.Tensor, dist: Dist = SINGLE) -> list:
    """The update's optimizer steps: [(epoch, |M & D'|, |M & C|, this rank's part of M)], the
    counts over all ranks' episodes (D' the kept ones, C those in the value loss), the part as
    indices into this rank's episodes. Each epoch shuffles every episode of the buffer (as
    indices into all ranks' episodes in rank order) and splits them into
    ceil(N / --minibatch-size) minibatches: the same steps whatever the filter keeps; the draw
    is the same in every rank and for any number of ranks. A minibatch lists its episodes in
    buffer order, so that the samples of one prompt are neighbours and share a micro-batch,
    and with it their prompt's forward (Policy.response_hidden_states); the sum over the
    minibatch is the same in any order."""
    keep_all, value_all = dist.cat(keep.float()).cpu(), dist.cat(value_on.float()).cpu()
    n_all = len(keep_all)
    first = dist.offset(len(keep))                    # this rank's episodes are [first, first + N)
    n_minibatches = math.ceil(n_all / cfg.minibatch_size)
    generator = torch.Generator().manual_seed(derived_seed(cfg.seed, it, MINIBATCHES))
    steps = []
    for epoch in range(cfg.ppo_epochs):
        for mb in torch.randperm(n_all, generator=generator).tensor_split(n_minibatches):
            mb = mb.sort().values
            steps.append((epoch, int(keep_all[mb].sum()), int(value_all[mb].sum()),
                          mb[(mb >= first) & (mb < first + len(keep))] - first))
    return steps


def clip_and_step(it: int, cfg: Config, policy, optimizer) -> float:
    """Clip the global gradient norm to --max-grad-norm (0: no clip) and take the optimizer
    step, unless a gradient is NaN/inf. Returns the norm before clipping."""
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
    require_finite(it, "update", gradient_norm=grad_norm)
    optimizer.step()
    return grad_norm.item()


def one_minibatch(cfg: Config) -> bool:
    """Does the update's one minibatch hold every episode of the iteration?"""
    return cfg.minibatch_size >= cfg.prompts_per_iter * cfg.samples_per_prompt


def reused_forwards(it: int, cfg: Config, policy, rollouts, reuse: str, timer, dist: Dist = SINGLE) -> list:
    """--speedups all: log pi_old and V_old (and log pi_ref) from the forward at theta_old that
    `reuse` names, run ahead with its graph kept (speedups.theta_old_forwards): the scoring's
    over the episodes in order, or the update's first over its first minibatch."""
    with timer("shared_forward"):
        order = torch.arange(len(rollouts))
        if reuse == "update":   # every episode is kept (no influence): the first minibatch holds them all
            every = torch.ones(len(rollouts), dtype=torch.bool, device=rollouts.response_mask.device)
            order = minibatch_plan(it, cfg, every, every, dist)[0][-1]
        return theta_old_forwards(policy, rollouts, order, batch_size=cfg.micro_batch_size, temperature=cfg.temperature,
                                  scoring=reuse == "scoring", reference=cfg.kl_beta > 0)


def sft_iteration(it: int, cfg: Config, policy, tokenizer, optimizer, train_examples, timer,
                  dist: Dist = SINGLE) -> tuple[dict, list]:
    """One SFT step: loss = (sum of NLL over the batch's reference tokens) / (their count),
    with the batch (and the count) spread over the ranks under torchrun. `train_examples`: the
    rows it trains on (main passes the validation rows under --sft-data val)."""
    examples = [train_examples[i] for i in batch_indices(len(train_examples), it, cfg.sft_batch_size, cfg.seed)]
    examples = examples[slice(*dist.share(len(examples)))]
    with timer("update"):
        seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                            [e.solution for e in examples], device=policy.device)
        n_tokens = dist.sum(seqs.response_mask.sum())                                     # all ranks
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=n_tokens.device)
        for micro in chunks(torch.arange(len(seqs)), cfg.micro_batch_size):
            nll, _ = sft_nll(policy, seqs.select(micro))
            loss = nll.sum() / n_tokens
            require_finite(it, "update", sft_loss=loss)
            loss.backward()
            total += loss.item()
        dist.sum_grads([p for p in policy.parameters() if p.requires_grad])
        clip_and_step(it, cfg, policy, optimizer)
    return {"sft_loss": dist.sum(total).item(), "tokens": int(n_tokens)}, []


# ----------------------------------------------------------------------------- bookkeeping

def iteration_records(it, cfg: Config, buf: Buffer, n_kept: int, influence: dict, update: dict,
                      dist: Dist = SINGLE) -> tuple[dict, list]:
    """Bookkeeping of ppo_iteration: the metrics of the iteration (means over all ranks'
    episodes, each with its denominator) and one record per episode (all ranks', rank order)."""
    examples, rollouts, rewards, flipped, kl, keep, weights = (buf.examples, buf.rollouts, buf.rewards, buf.flipped,
                                                              buf.kl, buf.keep, buf.weights)
    mask = rollouts.response_mask
    golds = [examples[j].gold for j in rollouts.prompt_index]
    answers = [extract_answer(t, cfg.dataset) for t in rollouts.responses]
    correct = [is_correct(a, g, cfg.dataset) for a, g in zip(answers, golds)]
    # arith: is the reasoning behind each answer faithful (reasoning.py)? None on other tasks.
    labels = ([reasoning_label(t, examples[j].solution, examples[j].gold)
               for t, j in zip(rollouts.responses, rollouts.prompt_index)] if cfg.dataset == "arith" else None)
    warnings = batch_warnings(cfg, dist.cat(rewards), dist.cat(rollouts.truncated.to(mask.device, torch.float32)).bool(),
                              n_kept, influence)
    for what in warnings.values():
        if dist.is_main:
            print(f"[it {it + 1}] warning: {what}", file=sys.stderr)
    # Sums and counts over all ranks first, then the means.
    total = dict(zip(("reward", "correct", "unparsed", "truncated", "tokens", "episodes", "kl"), dist.sum(torch.tensor(
        [rewards.sum().item(), sum(correct), sum(a is None for a in answers), rollouts.truncated.sum().item(),
         mask.sum().item(), len(rollouts), 0.0 if kl is None else kl.sum().item()],
        dtype=torch.float64, device=mask.device)).tolist()))
    per_episode = {k: total[k] / total["episodes"] for k in ("reward", "correct", "unparsed", "truncated", "tokens")}
    metrics = {
        "reward": per_episode["reward"], "accuracy": per_episode["correct"], "unparsed": per_episode["unparsed"],
        "truncated": per_episode["truncated"], "response_tokens": per_episode["tokens"],
        "episodes": int(total["episodes"]), "kept": n_kept, "kept_fraction": n_kept / total["episodes"],
        # The KL to pi_ref, mean over all response tokens; logged only where it is computed
        # (--kl-beta > 0): at beta 0 the reference pass is skipped.
        **({} if kl is None else {"kl": total["kl"] / max(total["tokens"], 1.0)}),
        **{k: v for k, v in influence.items() if k != "scores"}, **update,
    }
    if labels is not None:
        counts = dict(zip(LABELS, dist.sum(torch.tensor([labels.count(name) for name in LABELS], dtype=torch.float64,
                                                        device=mask.device)).tolist()))
        n_correct = counts["faithful"] + counts["unfaithful"]
        # shares of all episodes, and the unfaithful share of the correct ones (None: none correct)
        metrics |= {f"{name}_fraction": counts[name] / total["episodes"] for name in LABELS}
        metrics["unfaithful_of_correct"] = counts["unfaithful"] / n_correct if n_correct else None
    if cfg.reward_noise > 0:
        metrics |= noise_metrics(dist.cat(torch.tensor(flipped, dtype=torch.float32, device=mask.device)).bool(),
                                 dist.cat(keep.float()).bool(),
                                 dist.cat(torch.tensor(influence["scores"], device=mask.device))
                                 if "scores" in influence else None)
    if warnings:
        metrics["warnings"] = list(warnings)
    episodes = [{"iteration": it + 1, "prompt": examples[j].question, "gold": golds[i], "response": rollouts.responses[i],
                 "answer": answers[i], "reward": rewards[i].item(), "truncated": bool(rollouts.truncated[i]),
                 "score": influence["scores"][i] if "scores" in influence else None,
                 "kept": bool(keep[i]), "weight": weights[i].item(), "flipped": flipped[i],
                 "reasoning": None if labels is None else labels[i]}
                for i, j in enumerate(rollouts.prompt_index)]
    return metrics, dist.gather_objects(episodes)


def noise_metrics(flipped: torch.Tensor, keep: torch.Tensor, scores: torch.Tensor | None) -> dict:
    """With --reward-noise: the share of flipped rewards, and how well the filter finds them:
    flip_auc, the AUC of the influence scores for "not flipped" (influence.detection_auc; 0.5 is
    chance), and the share of flipped episodes among the dropped and among the kept. All (N,)
    over all ranks' episodes; scores None without influence."""
    share = lambda sel: flipped[sel].float().mean().item() if bool(sel.any()) else None   # noqa: E731
    metrics = {"flipped_fraction": flipped.float().mean().item()}
    if scores is not None:
        metrics |= {"flip_auc": detection_auc(scores, ~flipped), "flipped_share_dropped": share(~keep),
                    "flipped_share_kept": share(keep)}
    return metrics


# ----------------------------------------------------------------------------- helpers

def derived_seed(seed: int, iteration: int, purpose: int, rank: int = 0) -> int:
    """Every random draw of an iteration comes from (seed, iteration, purpose, rank), so a
    resumed run draws exactly what the uninterrupted run would have (rank: the torchrun process)."""
    return (seed * 1_000_003 + iteration * 7_919 + purpose + rank * 104_729) % (2**63)


def planted_flips(cfg: Config, it: int, n: int, rank: int = 0) -> list[bool]:
    """--reward-noise p: which of the iteration's n episodes have their correctness flipped,
    each independently with probability p, from a draw of its own (a resumed run flips the
    same episodes)."""
    noise = torch.Generator().manual_seed(derived_seed(cfg.seed, it, NOISE, rank))
    return (torch.rand(n, generator=noise) < cfg.reward_noise).tolist()


def batch_indices(n_examples: int, iteration: int, batch: int, seed: int, purpose: int = SHUFFLE) -> list[int]:
    """The training rows of an iteration: consecutive slices of a seeded permutation per epoch."""
    out = []
    for position in range(iteration * batch, (iteration + 1) * batch):
        epoch, offset = divmod(position, n_examples)
        order = torch.randperm(n_examples, generator=torch.Generator().manual_seed(derived_seed(seed, epoch, purpose)))
        out.append(int(order[offset]))
    return out


class Timer:
    """Seconds per named phase of an iteration."""
    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, name):
        t0 = time.time()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0


def make_optimizer(cfg: Config, policy) -> torch.optim.AdamW:
    """AdamW without weight decay: the LoRA tensors at --lr, the value head at --value-lr."""
    value_head = list(policy.value_head.parameters())
    lora = [p for p in policy.parameters() if p.requires_grad and all(p is not v for v in value_head)]
    return torch.optim.AdamW([{"params": lora, "lr": cfg.lr}, {"params": value_head, "lr": cfg.value_lr}],
                             weight_decay=0.0)


def chunks(index: torch.Tensor, size: int):
    return [index[s:s + size] for s in range(0, len(index), size)]


def require_finite(it: int, phase: str, **tensors: torch.Tensor) -> None:
    """Stop the run on a NaN or inf, naming the iteration, the phase and the tensor (None: not
    computed, skipped). Raised before anything of the iteration is saved, so checkpoints/latest
    stays the last good one."""
    for name, t in tensors.items():
        if t is None:
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise FloatingPointError(f"iteration {it + 1}: {name} contains NaN/inf ({bad} of {t.numel()} values) "
                                     f"(phase: {phase})")


# How far the sampler's log-probs of its own tokens may be from pi_old's before a warning, in
# nats per token (largest over the batch's response tokens). Both are log-softmax(logits / T) of
# the same weights, once through the KV-cache decode and once through the full forward, so they
# differ by rounding alone. Measured on CPU (bench/sampler_drift.py, docs/sampler-drift.md): a
# largest gap of 1.4e-5 (tiny world) and 1.7e-5 (Gemma-3-270M) in fp32, exactly 0 in bf16 on the
# CPU's kernels. Our thresholds: 1e-3 in fp32, about 60 times the largest gap measured; 0.5 in
# bf16, not measured on a GPU, where the decode and the full forward take different attention
# kernels: a bf16 logit of size 20-30 carries about 0.1 of rounding, so 0.5 nats is a few times
# that. A gap beyond it means the tokens were not drawn from the distribution PPO takes as pi_old.
SAMPLER_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.5}


def sampler_drift(rollouts, dtype: torch.dtype, dist: Dist = SINGLE) -> dict:
    """|log pi_sampler(a_t) - log pi_old(a_t)| over all ranks' response tokens: the largest and
    the mean, and the tolerance for the model's dtype. pi_sampler is what the sampler computed
    as it drew the token (rollout.sample); pi_old is the full forward that PPO's ratio uses."""
    mask = rollouts.response_mask
    gap = (rollouts.sampler_logprobs - rollouts.old_logprobs).abs() * mask                     # (N, T)
    total, count = dist.sum(torch.stack([gap.sum().double(), mask.sum().double()])).tolist()
    largest = dist.cat(gap.max().reshape(1).double()).max().item()
    return {"sampler_gap_max": largest, "sampler_gap_mean": total / max(count, 1.0),
            "sampler_tolerance": SAMPLER_TOLERANCE.get(dtype, 1.0)}


def batch_warnings(cfg: Config, rewards: torch.Tensor, truncated: torch.Tensor, n_kept: int,
                   drift: dict | None = None) -> dict[str, str]:
    """Degenerate iterations: handled (the run goes on) but logged, {name: explanation}.
    rewards, truncated: (N,) over all episodes of the iteration (all ranks); drift: sampler_drift's."""
    warnings = {}
    if drift and drift.get("sampler_gap_max", 0.0) > drift["sampler_tolerance"]:
        warnings["sampler_gap"] = (f"the sampler's log-prob of a sampled token differs from pi_old's by up to "
                                   f"{drift['sampler_gap_max']:.2g} nats (tolerance {drift['sampler_tolerance']:g} "
                                   "for this dtype): the episodes were not drawn from the pi_old that PPO uses")
    if bool((rewards == rewards[0]).all()):
        warnings["rewards_equal"] = (f"all {len(rewards)} rewards are {rewards[0].item():g}: no reward signal, "
                                     "the advantages carry only the KL penalty and the value error")
    if bool(truncated.all()):
        warnings["all_truncated"] = (f"every response hit --max-new-tokens {cfg.max_new_tokens} without EOS "
                                     "(consider a larger limit or --truncation-penalty)")
    if n_kept == 0:
        warnings["nothing_kept"] = "every episode scored <= 0: update skipped"
    return warnings


# ----------------------------------------------------------------------------- logging

def log_line(it: int, cfg: Config, m: dict, seconds: dict) -> str:
    phases = " ".join(f"{k} {v:.1f}" for k, v in seconds.items())
    if cfg.algo == "sft":
        body = f"sft loss {m['sft_loss']:.4f} ({m['tokens']} tokens)"
    else:
        body = (f"reward {m['reward']:.3f} acc {m['accuracy']:.3f} trunc {m['truncated']:.2f} len {m['response_tokens']:.0f} | "
                f"kept {m['kept']}/{m['episodes']}")
        if "score_mean" in m:
            body += (f" (ess {m['weight_ess']:.0f}) score {m['score_mean']:+.2e} "
                     f"[{m['score_min']:+.2e}, {m['score_max']:+.2e}]")
        body += f" | kl {m['kl']:.4f}" if "kl" in m else " |"
        if not m.get("skipped"):
            vf = "-" if m["value_loss"] is None else f"{m['value_loss']:.4f}"      # GRPO: no critic
            body += (f" pg {m['policy_loss']:+.4f} vf {vf} ent {m['entropy']:.3f} "
                     f"clip {m['clip_fraction']:.3f} akl {m['approx_kl']:.4f} ratio0 {m['ratio_first_max']:.3f} "
                     f"gap {m['sampler_gap_max']:.0e}")
            if "sft_loss" in m:   # --sft-coef: the SFT term's mean NLL
                body += f" sft {m['sft_loss']:.4f}"
        ev = m["explained_variance"]
        body += f" | adv {m['advantage_mean']:+.3f} ev " + ("n/a" if ev is None else f"{ev:+.2f}")
        if m.get("unfaithful_of_correct") is not None:   # arith: unfaithful share of the correct episodes
            body += f" | unf {m['unfaithful_of_correct']:.2f}"
        if "flipped_fraction" in m:  # --reward-noise
            body += f" | flipped {m['flipped_fraction']:.2f}"
            if m.get("flip_auc") is not None:
                body += f" auc {m['flip_auc']:.2f}"
    line = f"[it {it + 1:>3}/{cfg.iterations}] {body} | s: {phases}"
    if m.get("warnings"):
        line += f" | warnings: {','.join(m['warnings'])}"
    if "eval_accuracy" in m:
        line += f" | eval acc {m['eval_accuracy']:.3f} ({m['eval_n']} problems)"
        if m.get("eval_unfaithful_of_correct") is not None:
            line += f" unf {m['eval_unfaithful_of_correct']:.2f}"
        if m.get("eval_faithful_accuracy") is not None:
            line += f" faithful acc {m['eval_faithful_accuracy']:.3f}"
    return line


def run_eval(cfg, policy, tokenizer, eval_examples, dist: Dist = SINGLE) -> dict:
    """Greedy exact match on eval_examples (under torchrun each rank takes its share and the
    counts are summed); on arith also the unfaithful share of the correct greedy answers
    (reasoning.py)."""
    mine = eval_examples[slice(*dist.share(len(eval_examples)))]
    # correct, n, unparsed, truncated, unfaithful (of the correct)
    counts = torch.zeros(5, dtype=torch.float64, device=policy.device)
    if mine:
        r = evaluate(policy, tokenizer, mine, cfg.dataset, max_new_tokens=cfg.eval_max_new_tokens,
                     batch_size=cfg.gen_batch_size, progress=cfg.progress)
        unfaithful = r["reasoning"]["greedy"]["unfaithful"] if "reasoning" in r else 0
        counts += torch.tensor([r["n_correct"], r["n"], r["n_unparsed"], r["n_truncated"], unfaithful],
                               dtype=torch.float64, device=counts.device)
    n_correct, n, n_unparsed, n_truncated, n_unfaithful = dist.sum(counts).tolist()
    accuracy = n_correct / max(n, 1)
    out = {"eval_accuracy": accuracy, "eval_stderr": math.sqrt(accuracy * (1 - accuracy) / max(n, 1)),
           "eval_n": int(n), "eval_unparsed": int(n_unparsed), "eval_truncated": int(n_truncated)}
    if cfg.dataset == "arith":   # and the share of problems answered right with faithful reasoning
        out["eval_unfaithful_of_correct"] = n_unfaithful / n_correct if n_correct else None
        out["eval_faithful_accuracy"] = (n_correct - n_unfaithful) / max(n, 1)
    return out


# ----------------------------------------------------------------------------- main

def main(argv=None) -> Path:
    """Train; returns the run directory. Bad flags raise SystemExit naming the flag, before the
    model is loaded where the model's config or the data suffice to tell. A NaN or inf raises
    FloatingPointError naming the iteration and the phase (rollout, reward, influence, update);
    nothing of that iteration is saved, so checkpoints/latest is the last good iteration and
    --resume continues from it. (On the command line it ends with that message, exit status 1.)
    Under torchrun every rank runs main(); only rank 0 prints, writes the run directory and
    checkpoints."""
    dist = setup_distributed()
    cfg = parse_config(argv)
    check_against_world(cfg, dist.world)
    if not dist.is_main:
        dist.barrier()  # rank 0 first: on first use it converts the offline model, once
    check_against_model(cfg, inspect_model(cfg.model, cfg.trust_remote_code))
    if dist.is_main:
        dist.barrier()
    difficulty = {"arith_digits": cfg.arith_digits, "arith_terms": cfg.arith_terms}
    train_task = load_task(cfg.dataset, "train", cfg.data_source, **difficulty)
    test_task = load_task(cfg.dataset, "test", cfg.data_source, **difficulty)
    check_against_data(cfg, len(train_task.examples))
    # A resume uses the run's pinned copy of --init-adapter (rundir.pin_init_adapter), not the
    # source, unless nothing was committed yet (then the run starts over, from the source).
    from_scratch = not (cfg.resume and latest_checkpoint(Path(cfg.resume)) is not None)
    source = resolve_checkpoint(cfg.init_adapter, "--init-adapter") if cfg.init_adapter and from_scratch else None
    run_dir = Path(dist.broadcast(str(open_run_dir(cfg)) if dist.is_main else None))
    init_adapter = None
    if cfg.init_adapter:
        if dist.is_main:
            pin_init_adapter(run_dir, source)
        dist.barrier()
        init_adapter = run_dir / "init_adapter"
    say = print if dist.is_main else (lambda *args, **kwargs: None)  # rank 0 speaks for all
    cfg.progress = cfg.progress and dist.is_main
    say("[config] " + " ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()), file=sys.stderr)
    if dist.active:
        say(f"[torchrun] {dist.world} processes, backend {dist.backend}", file=sys.stderr)

    # Seeded here, after everything that may build or convert a model on first use: the LoRA
    # initialisation is the first draw of the run, whether the model was just built or cached.
    torch.manual_seed(cfg.seed)
    policy, tokenizer = load_policy(cfg.model, device=cfg.device, dtype=cfg.dtype, lora_targets=cfg.targets(),
                                    lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                    trust_remote_code=cfg.trust_remote_code, quiet=not dist.is_main)
    # Every rank starts from rank 0's trainable tensors (equal already when the seeds agree), checked.
    dist.broadcast_tensors([p for p in policy.parameters() if p.requires_grad])
    policy.value_through_adapters = cfg.critic_grad == "adapters"     # our choice: head (model.Policy)
    optimizer = make_optimizer(cfg, policy)

    # Our choice: the validation set is the last val_size rows of the training split, the same
    # for every seed, and never used as a training prompt.
    train_examples, val_examples = train_task.examples[:-cfg.val_size], train_task.examples[-cfg.val_size:]
    if cfg.eval_split == "dev":   # held out from training too: rows that neither the update nor g_val sees
        train_examples, eval_examples = train_examples[:-cfg.eval_limit], train_examples[-cfg.eval_limit:]
    else:
        eval_examples = (test_task.examples if cfg.eval_split == "test" else val_examples)[:cfg.eval_limit]
    eval_source = {"test": test_task.source, "dev": "held-out training rows (before the validation rows)",
                   "val": "the validation rows"}[cfg.eval_split]
    say(f"[data] train {len(train_examples)} + validation {len(val_examples)} rows from {train_task.source}; "
        f"eval {len(eval_examples)} rows from {eval_source}", file=sys.stderr)
    val_share = val_examples[slice(*dist.share(len(val_examples)))]   # all of them in one process
    val_seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in val_share],
                            [e.solution for e in val_share], device=policy.device)

    start = restore_run(run_dir, cfg.keep_checkpoints, policy, optimizer, writer=dist.is_main) if cfg.resume else 0
    if start == 0 and init_adapter:
        # SFT trains no value head: only the LoRA tensors are taken.
        load_adapter(policy, init_adapter, with_value_head=False)
        say(f"[init] LoRA adapters from {init_adapter} (the run's pinned copy of {cfg.init_adapter})", file=sys.stderr)
    if init_adapter:
        # Our choice: the KL reference is the policy the run started from (base + init adapter),
        # as in RLHF's SFT reference; the base model would pull the policy back from what SFT learnt.
        load_reference_adapter(policy, init_adapter)
    if dist.is_main:
        write_atomic(run_dir / "data.json", json.dumps({"train": train_task.source, "test": test_task.source,
                                                        "val_rows": [e.where for e in val_examples],
                                                        "eval_rows": [e.where for e in eval_examples]}, indent=2))

    if start == 0 and cfg.eval_every:
        m = run_eval(cfg, policy, tokenizer, eval_examples, dist)
        if dist.is_main:
            append_jsonl(run_dir / "metrics.jsonl", [{"iteration": 0, **m}])
        unf, faithful = m.get("eval_unfaithful_of_correct"), m.get("eval_faithful_accuracy")
        say(f"[it   0/{cfg.iterations}] eval acc {m['eval_accuracy']:.3f} ({m['eval_n']} problems, before training)"
            + ("" if unf is None else f" unf {unf:.2f}") + ("" if faithful is None else f" faithful acc {faithful:.3f}"))

    with last_good_checkpoint_on_fault(run_dir):
        for it in range(start, cfg.iterations):
            timer = Timer()
            if cfg.algo == "sft":
                sft_examples = val_examples if cfg.sft_data == "val" else train_examples
                metrics, episodes = sft_iteration(it, cfg, policy, tokenizer, optimizer, sft_examples, timer, dist)
            else:
                metrics, episodes = ppo_iteration(it, cfg, policy, tokenizer, optimizer, train_examples, val_seqs,
                                                  timer, dist)
            last = it + 1 == cfg.iterations
            stop = cfg.stop_below_kept > 0 and metrics.get("kept_fraction", 1.0) < cfg.stop_below_kept
            if cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or last or stop):
                with timer("eval"):
                    metrics |= run_eval(cfg, policy, tokenizer, eval_examples, dist)
            metrics["seconds"] = dict(timer.seconds)   # rank 0's
            say(log_line(it, cfg, metrics, timer.seconds), flush=True)
            if dist.is_main:
                commit_iteration(run_dir, it, cfg, metrics, episodes, policy, optimizer)
                if cfg.plots and "eval_accuracy" in metrics and not last:
                    write_plots(run_dir)     # the curve so far, for whoever opens plots.png mid-run
            if stop:
                say(f"[stop] kept fraction {metrics['kept_fraction']:.2f} < --stop-below-kept {cfg.stop_below_kept}")
                break
    if dist.is_main and cfg.plots:
        say(f"[report] {write_plots(run_dir)}, {write_report(run_dir)}", file=sys.stderr)
    if dist.is_main:
        unlock_run_dir(run_dir)
    dist.close()
    say(f"[done] run directory: {run_dir}")
    return run_dir


if __name__ == "__main__":
    try:
        main()
    except FloatingPointError as err:
        raise SystemExit(f"[error] {err}") from err
