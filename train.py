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

`--influence off` is plain PPO; `--algo sft` trains on reference solutions (sft.py); `--selection` picks
another rule for which rollouts the update learns from (selection.py). Each pass is computed as the
box defines it (Definitions below) or, by default, with the exact speed-ups of speedups.py. The settings are in config.py, the run directory (crash-safe commits, resume)
in rundir.py, the records of an iteration in logbook.py; a NaN/inf stops the run naming the
phase (optim.require_finite). `python train.py --help` lists every flag.

Public: main(argv) -> run directory; the phases ppo_iteration (-> Buffer), compute_advantages,
select_episodes, ppo_update (each takes `dist`, see distributed.py), passes_for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import torch
from tqdm import tqdm

import speedups
from accuracy import run_eval
from config import Config, check_against_data, check_against_model, check_against_ranks, parse_config
from distributed import SINGLE, Single
from distributed import setup as setup_distributed
from draws import (MINIBATCHES, ROUND, SAMPLING, VAL_SAMPLING, derived_seed, filter_draw, iteration_prompts,
                   planted_flips, validation_rows)
from influence import (binary_filter, dtv_filter, episode_gradients, filter_and_reweight, influence_scores,
                       loop_batch_scores, random_filter, sft_nll, shuffled_weights, validation_gradient)
from logbook import Timer, evaluation_due, iteration_records, log_line, start_line
from model import inspect_model, load_adapter, load_policy, load_reference_adapter
from offline_models import model_source
from optim import clip_and_step, make_optimizer, require_finite
from ppo import gae, group_advantages, kl_penalized_rewards, masked_mean, policy_loss, value_loss, whiten
from report import write_plots, write_report
from reward import reward_fn
from rollout import Rollouts, encode_pairs, generate_rollouts, old_and_ref_logprobs, token_logprobs
from selection import RULES, prompt_gradients
from rundir import (commit_iteration, last_good_checkpoint_on_fault, open_run, record_start, restore_run,
                    selection_state, unlock_run_dir, write_atomic)
from sft import sft_iteration, sft_term
from tasks import load_task, make_prompt


# ----------------------------------------------------------------------------- the algorithm
#
# Under torchrun (distributed.py) each rank runs these functions on its share of the prompts; every sum,
# mean or selection that the algorithm box defines over the whole batch goes through `dist`, so K ranks
# compute the update of one process holding all K shares. In one process `dist` is SINGLE: they do nothing.

def ppo_iteration(it: int, cfg: Config, policy, tokenizer, optimizer, data, val_seqs, timer,
                  selection: dict, dist: Single = SINGLE) -> Buffer:   # selection: the --selection rule's state
    """One I-PPO iteration, the algorithm box of the paper, on this rank's share of the prompts.
    Returns its Buffer, from which logbook.iteration_records makes the run's records."""
    passes = passes_for(it, cfg, dist)   # how each pass below computes (the definitions, or --speedups)
    # The samples and their rewards, in the Buffer that each phase below adds its part to; which prompts
    # are sampled and which episodes go on is the --selection rule's (selection.py).
    buf = RULES[cfg.selection](cfg, lambda k, n, keep=None, validation=False: sample(
        it, k, n, cfg, policy, tokenizer, data, timer, dist, keep, validation), selection,
        lambda b: prompt_gradients(cfg, policy, b, compute_advantages, timer))
    passes.old_policy(policy, buf.rollouts, timer)   # log pi_old, V_old (and log pi_ref at beta > 0)
    require_finite(it, "rollout", old_logprobs=buf.rollouts.old_logprobs, values=buf.rollouts.values,
                   ref_logprobs=buf.rollouts.ref_logprobs)

    with timer("advantages"):
        buf.advantages, buf.returns, buf.kl, buf.raw_advantages = compute_advantages(cfg, buf, dist)  # (N, T) each

    with timer("influence"):
        buf.keep, buf.weights = select_episodes(it, cfg, policy, buf, val_seqs, passes, dist)
        buf.n_kept = int(dist.sum(buf.keep.sum()))                                       # |D'| over all ranks
        if cfg.rewhiten_kept and buf.n_kept > 0:   # the kept set's w-weighted mean advantage back to 0
            buf.advantages = whiten(buf.advantages, buf.rollouts.response_mask, reduce_sum=dist.sum,
                                    std_floor=cfg.adv_std_floor, weights=buf.weights * buf.keep)

    with timer("update"):
        if buf.n_kept > 0:
            buf.update = ppo_update(it, cfg, policy, optimizer, buf, passes, dist, sft_seqs=val_seqs)
    return buf


def sample(it, k, n, cfg: Config, policy, tokenizer, data, timer, dist=SINGLE, keep=None, validation=False) -> Buffer:
    """n responses to each of round k's training prompts of iteration `it` (draws.iteration_prompts: k = 0 the
    iteration's own; k > 0 a rule's further ones; `keep`, `validation`: selection.py), sampled at --temperature,
    with their rewards R_i (after any planted flip; validation problems' never flipped)."""
    # this rank's share of round k's prompts (all of them in one process), those the rule keeps
    examples = ([data.val[i] for i in validation_rows(cfg.seed, it, cfg.gradalign_val, len(data.val))] if validation
                else (keep or list)(iteration_prompts(data.train, it, k, cfg)[slice(*dist.span(cfg.prompts_per_iter))]))
    with timer("rollout"):
        rollouts = generate_rollouts(policy, tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples], n_samples=n,
                                     max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, batch_size=cfg.gen_batch_size,
                                     seed=derived_seed(cfg.seed, it, VAL_SAMPLING if validation else SAMPLING + ROUND * k, dist.rank),
                                     progress=cfg.progress)
    with timer("reward"):
        flipped = [False] * len(rollouts) if validation else planted_flips(cfg, it, len(rollouts), dist.rank, k)  # (N,)
        rewards = torch.tensor([reward_fn(text, examples[j].gold, cfg.dataset, bool(trunc), cfg.truncation_penalty, flip)
                                for text, j, trunc, flip in zip(rollouts.responses, rollouts.prompt_index, rollouts.truncated,
                                                                flipped)], device=rollouts.response_mask.device)  # (N,)
        require_finite(it, "reward", rewards=rewards)
    return Buffer(examples, rollouts, flipped, rewards, generated_tokens=int(rollouts.response_mask.sum()))


@dataclasses.dataclass
class Buffer:
    """One iteration's data, in one place. ppo_iteration makes it from the rollouts and each
    phase adds its part. Every tensor is over this rank's N episodes."""
    examples: list                              # the prompts' examples (data.Example)
    rollouts: Rollouts                          # tokens, masks, log pi_old, V_old, log pi_ref, sampler log-probs
    flipped: list | None = None                 # (N,) bool: reward flipped by --reward-noise
    rewards: torch.Tensor | None = None         # (N,) the task reward R_i (exact match, after any flip)
    generated_tokens: int = 0                   # response tokens sampled, the rule's dropped episodes included
    raw_advantages: torch.Tensor | None = None  # (N, T) A_t from GAE (or GRPO), before whitening
    advantages: torch.Tensor | None = None      # (N, T) A_t as the update uses them
    returns: torch.Tensor | None = None         # (N, T) R_t, the value targets (zeros under GRPO)
    kl: torch.Tensor | None = None              # (N, T) log pi_old - log pi_ref (None at --kl-beta 0)
    scores: torch.Tensor | None = None          # (N,) s_i (None without influence)
    g_val_norm: float | None = None             # |g_val| (None without it)
    keep: torch.Tensor | None = None            # (N,) bool: in D', the episodes the update learns from
    weights: torch.Tensor | None = None         # (N,) w_i (1 for every kept episode but under reweighting)
    n_kept: int = 0                             # |D'| over all ranks
    update: dict | None = None                  # what ppo_update recorded (None: no update, nothing kept)


def compute_advantages(cfg: Config, buf: Buffer, dist: Single = SINGLE):
    """r_t = -beta (log pi_old - log pi_ref) + the task reward R_i at the last token
    (ppo.kl_penalized_rewards); A_t, R_t = GAE(gamma, lambda) with the critic's V_old (ppo.gae);
    A whitened over the response tokens of the whole batch, all ranks', its std floored at
    --adv-std-floor (ppo.whiten). Returns (advantages, returns, kl, advantages before
    whitening), each (N, T) (kl None at --kl-beta 0, where pi_ref is not computed).
    With --advantage grpo: ppo.group_advantages of the episodes' summed rewards on every token,
    not whitened, no returns (zeros) and no critic."""
    rollouts, mask = buf.rollouts, buf.rollouts.response_mask
    token_rewards, kl = kl_penalized_rewards(buf.rewards, rollouts.old_logprobs, rollouts.ref_logprobs, mask, cfg.kl_beta)
    if cfg.advantage == "grpo":
        # Our choice: the KL penalty enters GRPO as the episode's summed per-token reward (the
        # same total as PPO's), before the group normalisation.
        prompts = torch.as_tensor(rollouts.prompt_index, device=mask.device)
        advantages = group_advantages(token_rewards.sum(-1), prompts)[:, None] * mask                      # (N, T)
        return advantages, torch.zeros_like(mask), kl, advantages
    advantages, returns = gae(token_rewards, rollouts.values, mask, cfg.gamma, cfg.lam)
    return whiten(advantages, mask, reduce_sum=dist.sum, std_floor=cfg.adv_std_floor), returns, kl, advantages


def select_episodes(it, cfg: Config, policy, buf: Buffer, val_seqs, passes, dist: Single = SINGLE):
    """Influence scores at theta_old (into buf.scores) and the kept set D' with its weights, from
    buf.rollouts and buf.advantages. Returns (keep (N,) bool, weights (N,)) for this rank's
    episodes; the filter and the weight normalisation (mean score over the kept episodes) see
    all ranks' scores."""
    rollouts, advantages, N = buf.rollouts, buf.advantages, len(buf.rollouts)
    if cfg.influence == "off":  # plain PPO (or a --selection rule's episodes): every episode, weight 1
        return torch.ones(N, dtype=torch.bool, device=advantages.device), torch.ones(N, device=advantages.device)
    if cfg.score_against == "validation":
        buf.scores, g_val = validation_scores(it, cfg, policy, rollouts, advantages, val_seqs, passes, dist)
        buf.g_val_norm = g_val.norm().item()
    else:
        buf.scores = batch_scores(cfg, policy, rollouts, advantages, passes, dist)
    all_scores = dist.cat(buf.scores)                                                                 # (N_all,)
    require_finite(it, "influence", scores=all_scores)
    if cfg.random_filter:
        keep, weights = random_filter(all_scores, filter_draw(cfg.seed, it))
    elif cfg.score_against != "validation":
        keep, weights = dtv_filter(all_scores)
    elif cfg.reweight:   # (--shuffle-weights, the control: the same kept set, its weights permuted among the kept)
        keep, weights = shuffled_weights(all_scores, filter_draw(cfg.seed, it)) if cfg.shuffle_weights else filter_and_reweight(all_scores)
    else:
        keep, weights = binary_filter(all_scores)
    mine = slice(dist.offset(N), dist.offset(N) + N)  # this rank's episodes within all_scores
    return keep[mine], weights[mine]


def validation_scores(it, cfg: Config, policy, rollouts, advantages, val_seqs, passes, dist: Single = SINGLE):
    """I-PPO's s_i = g_i . g_val for this rank's episodes, and g_val. Both gradients are taken
    at the sampling temperature (our choice, influence.py's docstring says why)."""
    # --val-subset K: not exact, cheaper, g_val over a fresh random K of the solutions (one process only)
    val_seqs = val_seqs.select(validation_rows(cfg.seed, it, cfg.val_subset, cfg.val_size)) if cfg.val_subset else val_seqs
    # g_val over the whole validation set: each rank's share divided by the token count of all shares, summed.
    g_val = dist.sum(passes.validation_gradient(policy, val_seqs, n_tokens=dist.sum(val_seqs.response_mask.sum())))
    require_finite(it, "influence", g_val=g_val)                                          # (P,)
    return passes.scores(policy, rollouts, advantages, g_val), g_val                         # (N,)


def batch_scores(cfg: Config, policy, rollouts, advantages, passes, dist: Single = SINGLE) -> torch.Tensor:
    """DTV's validation-free scores (--score-against batch | batch-loo) for this rank's episodes:
    g_i . the mean gradient of all ranks' episodes (without episode i for batch-loo)."""
    n_total = int(dist.sum(torch.tensor(float(len(rollouts)), device=advantages.device)))
    return passes.batch_scores(policy, rollouts, advantages, leave_one_out=cfg.score_against == "batch-loo",
                               reduce_sum=dist.sum, n_total=n_total)


def ppo_update(it, cfg: Config, policy, optimizer, buf: Buffer, passes, dist: Single = SINGLE,
               sft_seqs=None) -> dict:
    """PPO epochs over the buffer (its rollouts, advantages, returns, keep and weights). Per
    optimizer step on a minibatch M:
        loss = (1/|M & D'|) sum_{i in M & D'} [ w_i L_clip_i - c_e H_i ]  +  c_v (1/|M & C|) sum_{i in M & C} L_V_i
    where D' is the kept episodes and C the critic's (--critic-episodes: all of them by default,
    or D'); per-episode losses are token means and the value loss is unweighted (our choices).
    The minibatches hold every episode (minibatch_plan: the same steps whatever the filter
    keeps); with --minibatch-size >= N this is exactly the objective of the algorithm box.
    Under torchrun the gradients are summed over ranks before each step.
    With --sft-coef c > 0 every step's loss also has c times the mean NLL of a batch of
    `sft_seqs`, the validation solutions (sft_term): the PPO-plus-SFT control.
    Returns what logbook.update_metrics reports from: each micro-batch's detached log-probs and
    per-episode losses, the steps' gradient norms and SFT losses."""
    rollouts, advantages, returns, keep, weights = buf.rollouts, buf.advantages, buf.returns, buf.keep, buf.weights
    value_loss_on = cfg.advantage == "gae" and cfg.vf_coef > 0                             # a critic to train?
    uses = keep if not value_loss_on or cfg.critic_episodes == "kept" else torch.ones_like(keep)   # (N,) forwards that count
    value_on = uses if value_loss_on else torch.zeros_like(keep)                            # (N,) in the value loss
    steps = minibatch_plan(it, cfg, keep, value_on, dist)
    record, grad_norms, sft_losses = [], [], []
    for step, (epoch, n_policy, n_value, minibatch) in enumerate(tqdm(steps, desc="updating", unit="step",
                                                                      disable=not cfg.progress, leave=False)):
        optimizer.zero_grad(set_to_none=True)
        minibatch = minibatch[uses[minibatch.to(keep.device)].cpu()]   # skip episodes that add nothing
        for micro, logprobs, values, entropy in passes.update_forwards(policy, rollouts, minibatch, step):
            part = rollouts.select(micro)
            kept, in_value = keep[micro].float(), value_on[micro].float()                # (n,) each
            pg = policy_loss(logprobs, part.old_logprobs, advantages[micro], part.response_mask, cfg.clip_eps)  # (n,)
            vf = value_loss(values, part.values, returns[micro], part.response_mask, cfg.value_clip_eps)       # (n,)
            ent = masked_mean(entropy, part.response_mask)                                    # (n,)
            # At c_e = 0 the entropy (logged) stays out of the graph: no backward through it.
            bonus = cfg.ent_coef * (kept * ent).sum() if cfg.ent_coef else 0.0
            loss = ((weights[micro] * kept * pg).sum() - bonus) / max(n_policy, 1)
            if value_loss_on:
                loss = loss + cfg.vf_coef * (in_value * vf).sum() / max(n_value, 1)
            require_finite(it, f"update, epoch {epoch + 1}", loss=loss)
            loss.backward()
            record.append((step, micro, logprobs.detach(), pg.detach(), vf.detach(), ent.detach()))
        if cfg.sft_coef > 0:
            sft_losses.append(sft_term(it * len(steps) + step, cfg, policy, sft_seqs, passes))
        dist.sum_grads([p for p in policy.parameters() if p.requires_grad])
        grad_norms.append(clip_and_step(it, cfg, policy, optimizer))
    return {"record": record, "value_on": value_on, "steps": len(steps), "grad_norms": grad_norms, "sft_losses": sft_losses}


def minibatch_plan(it: int, cfg: Config, keep: torch.Tensor, value_on: torch.Tensor, dist: Single = SINGLE) -> list:
    """The update's optimizer steps: [(epoch, |M & D'|, |M & C|, this rank's part of M)], the
    counts over all ranks' episodes (D' the kept ones, C those in the value loss), the part as
    indices into this rank's episodes. Each epoch shuffles every episode of the buffer and
    splits them into ceil(N / --minibatch-size) minibatches: the same steps whatever the filter
    keeps; the draw is the same in every rank and for any number of ranks. A minibatch lists
    its episodes in buffer order, so that the samples of one prompt are neighbours and share a
    micro-batch (and with it their prompt's forward, speedups.shared_prompt_hidden_states); the
    sum over the minibatch is the same in any order."""
    keep_all, value_all = dist.cat(keep.float()).cpu(), dist.cat(value_on.float()).cpu()
    n_minibatches = math.ceil(len(keep_all) / cfg.minibatch_size)
    generator = torch.Generator().manual_seed(derived_seed(cfg.seed, it, MINIBATCHES))
    steps = []
    for epoch in range(cfg.ppo_epochs):
        for mb in torch.randperm(len(keep_all), generator=generator).tensor_split(n_minibatches):
            mb = mb.sort().values
            steps.append((epoch, int(keep_all[mb].sum()), int(value_all[mb].sum()), dist.mine(mb, len(keep))))
    return steps


class Definitions:
    """The passes of an iteration, each as the algorithm box defines it (--speedups off):
    log-probs by log_softmax and gather, one forward per sequence, g_i by a backward per
    episode, pi_old from its own no-grad pass. speedups.Passes (--speedups on, all) computes
    the same numbers from less work."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def old_policy(self, policy, rollouts, timer):
        """log pi_old and V_old (and log pi_ref, at --kl-beta > 0) by a no-grad pass after the sampling."""
        with timer("rollout"):
            rollouts.old_logprobs, rollouts.values, rollouts.ref_logprobs = old_and_ref_logprobs(
                policy, rollouts, self.cfg.temperature, self.cfg.gen_batch_size, ref=self.cfg.kl_beta > 0)

    def validation_gradient(self, policy, val_seqs, n_tokens):
        return validation_gradient(policy, val_seqs, self.cfg.val_batch_size, self.cfg.progress, n_tokens,
                                   temperature=self.cfg.temperature)

    def scores(self, policy, rollouts, advantages, g_val):   # s_i = g_i . g_val, g_i by a backward per episode
        return influence_scores(episode_gradients(policy, rollouts, advantages, clip_eps=self.cfg.clip_eps,
                                                  temperature=self.cfg.temperature, progress=self.cfg.progress), g_val)

    def batch_scores(self, policy, rollouts, advantages, **reference):
        return loop_batch_scores(episode_gradients(policy, rollouts, advantages, clip_eps=self.cfg.clip_eps,
                                                       temperature=self.cfg.temperature, progress=self.cfg.progress),
                                     **reference)

    def update_forwards(self, policy, rollouts, minibatch, step):
        """(micro-batch, log pi_theta, V_theta, entropy), --micro-batch-size episodes at a time."""
        return ((micro, *token_logprobs(policy, rollouts.select(micro), self.cfg.temperature, with_entropy=True))
                for micro in minibatch.split(self.cfg.micro_batch_size))

    def sft_nll(self, policy, seqs):
        return sft_nll(policy, seqs)


def passes_for(it: int, cfg: Config, dist: Single = SINGLE):
    """How iteration `it` computes its passes: by the definitions, or with --speedups."""
    return Definitions(cfg) if cfg.speedups == "off" else speedups.Passes(
        cfg, first_minibatch=lambda every: minibatch_plan(it, cfg, every, every, dist)[0][-1])


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
    check_against_ranks(cfg, dist.ranks)
    if not dist.is_main:
        dist.barrier()  # rank 0 first: on first use it converts the offline model, once
    check_against_model(cfg, inspect_model(model_source(cfg.model), cfg.trust_remote_code, name=cfg.model))
    if dist.is_main:
        dist.barrier()
    data = load_data(cfg)
    run_dir, init_adapter = open_run(cfg, dist)
    say = print if dist.is_main else (lambda *args, **kwargs: None)  # rank 0 speaks for all
    cfg.progress = cfg.progress and dist.is_main
    say("[config] " + " ".join(f"{k}={v}" for k, v in dataclasses.asdict(cfg).items()), file=sys.stderr)
    if dist.active:
        say(f"[torchrun] {dist.ranks} processes, backend {dist.backend}", file=sys.stderr)
    say(f"[data] train {len(data.train)} + validation {len(data.val)} rows from {data.train_source}; "
        f"eval {len(data.eval)} rows from {data.eval_source}", file=sys.stderr)
    policy, tokenizer, optimizer = load_model(cfg, dist)
    val_part = data.val[slice(*dist.span(len(data.val)))]   # all of them in one process
    val_seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in val_part],
                            [e.solution for e in val_part], device=policy.device)
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
        write_atomic(run_dir / "data.json", json.dumps(data.record, indent=2))
    if start == 0 and cfg.eval_every:
        m = run_eval(cfg, policy, tokenizer, data.eval, dist)
        if dist.is_main:
            record_start(run_dir, cfg, m)
        say(start_line(cfg, m))
    with last_good_checkpoint_on_fault(run_dir):
        train_loop(cfg, start, run_dir, policy, tokenizer, optimizer, data, val_seqs, say, dist)
    if dist.is_main and cfg.plots:
        say(f"[report] {write_plots(run_dir)}, {write_report(run_dir)}", file=sys.stderr)
    if dist.is_main:
        unlock_run_dir(run_dir)
    dist.close()
    say(f"[done] run directory: {run_dir}")
    return run_dir


def train_loop(cfg: Config, start: int, run_dir: Path, policy, tokenizer, optimizer, data, val_seqs, say,
               dist: Single = SINGLE) -> None:
    """Iterations start..--iterations: the algorithm, its records, the evaluations when due, and
    a commit of each iteration to the run directory (rundir.commit_iteration)."""
    selection = selection_state(run_dir) if start else {}   # the --selection rule's state (GRESO's prompt history)
    for it in range(start, cfg.iterations):
        timer = Timer()
        if cfg.algo == "sft":
            sft_examples = data.val if cfg.sft_data == "val" else data.train
            metrics, episodes = sft_iteration(it, cfg, policy, tokenizer, optimizer, sft_examples, timer,
                                              passes_for(it, cfg, dist), dist)
        else:
            buf = ppo_iteration(it, cfg, policy, tokenizer, optimizer, data, val_seqs, timer, selection, dist)
            metrics, episodes = iteration_records(it, cfg, buf, next(policy.lm.parameters()).dtype, dist)
            metrics |= selection.pop("log", {})   # the --selection rule's own numbers of the iteration
        stop = cfg.stop_below_kept > 0 and metrics.get("kept_fraction", 1.0) < cfg.stop_below_kept
        if evaluation_due(cfg, it, stop):
            with timer("eval"):
                metrics |= run_eval(cfg, policy, tokenizer, data.eval, dist)
        metrics["seconds"] = dict(timer.seconds)   # rank 0's
        say(log_line(it, cfg, metrics, timer.seconds), flush=True)
        if dist.is_main:
            commit_iteration(run_dir, it, cfg, metrics, episodes, policy, optimizer, selection)
            if cfg.plots and "eval_accuracy" in metrics and it + 1 < cfg.iterations:
                write_plots(run_dir)     # the curve so far, for whoever opens plots.png mid-run
        if stop:
            say(f"[stop] kept fraction {metrics['kept_fraction']:.2f} < --stop-below-kept {cfg.stop_below_kept}")
            break


@dataclasses.dataclass
class Data:
    """The rows of a run: training prompts, validation rows, evaluation rows, their sources (data.json)."""
    train: list
    val: list
    eval: list
    train_source: str
    eval_source: str
    record: dict


def load_data(cfg: Config) -> Data:
    """Our choice: g_val's validation set is the last --val-size training rows, never a training
    prompt; --eval-split dev holds out the --eval-limit rows before them too, which neither the
    update nor g_val sees; --train-pool K trains on the first K of the rest."""
    difficulty = {"arith_digits": cfg.arith_digits, "arith_terms": cfg.arith_terms}
    train_task, test_task = (load_task(cfg.dataset, split, cfg.data_source, **difficulty) for split in ("train", "test"))
    check_against_data(cfg, len(train_task.examples))
    train, val = train_task.examples[:-cfg.val_size], train_task.examples[-cfg.val_size:]
    if cfg.eval_split == "dev":
        train, evaluated = train[:-cfg.eval_limit], train[-cfg.eval_limit:]
    else:
        evaluated = (test_task.examples if cfg.eval_split == "test" else val)[:cfg.eval_limit]
    train = train[:cfg.train_pool or None]
    eval_source = {"test": test_task.source, "dev": "held-out training rows (before the validation rows)",
                   "val": "the validation rows"}[cfg.eval_split]
    record = {"train": train_task.source, "test": test_task.source, "val_rows": [e.where for e in val],
              "eval_rows": [e.where for e in evaluated]}
    return Data(train, val, evaluated, train_task.source, eval_source, record)


def load_model(cfg: Config, dist: Single = SINGLE):
    """The policy (LoRA and value head), its tokenizer and optimizer. Seeded here, after
    everything that may build or convert a model on first use: the LoRA initialisation is the
    first draw of the run, whether the model was just built or cached."""
    torch.manual_seed(cfg.seed)
    policy, tokenizer = load_policy(model_source(cfg.model), name=cfg.model, device=cfg.device, dtype=cfg.dtype, lora_targets=cfg.targets(),
                                    lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                    trust_remote_code=cfg.trust_remote_code, quiet=not dist.is_main)
    # Every rank starts from rank 0's trainable tensors (equal already when the seeds agree), checked.
    dist.broadcast_tensors([p for p in policy.parameters() if p.requires_grad])
    policy.value_through_adapters = cfg.critic_grad == "adapters"     # our choice: head (model.Policy)
    return policy, tokenizer, make_optimizer(cfg, policy)


if __name__ == "__main__":
    try:
        main()
    except FloatingPointError as err:
        raise SystemExit(f"[error] {err}") from err
