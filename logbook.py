"""The bookkeeping of a run: what an iteration did, in numbers and in words.

train.py runs the algorithm; this file turns what it did into the run's records, outside the
algorithm's way: the metrics of an iteration (metrics.jsonl) and its episode records
(episodes.jsonl), the warnings of a degenerate batch, the check of the sampler against pi_old,
the log line, when an evaluation is due (accuracy.run_eval runs it), and the timer of the phases. Every
mean is over all torchrun ranks' episodes, its denominator named (distributed.py).

Public:
    iteration_records(it, cfg, buf, dtype, dist) -> (metrics, episodes) of a train.ppo_iteration
    influence_metrics, critic_metrics, update_metrics  the parts of those metrics
    noise_metrics(flipped, keep, scores)   how well the filter finds planted reward noise
    detection_auc(scores, positive)        how well scores rank the positives first (ROC AUC)
    sampler_drift(rollouts, dtype, dist)   the sampler's log-probs against pi_old
    batch_warnings(cfg, rewards, truncated, n_kept, drift)   degenerate iterations, in words
    log_line(it, cfg, metrics, seconds)    the one line printed per iteration
    evaluation_due(cfg, it, stop)          whether this iteration ends with an evaluation
    Timer                                  seconds per named phase
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager

import torch

from config import Config
from distributed import SINGLE
from ppo import approx_kl, clip_fraction, explained_variance
from reasoning import LABELS
from reasoning import label as reasoning_label
from reward import extract_answer, is_correct



def iteration_records(it, cfg: Config, buf, dtype: torch.dtype, dist=SINGLE) -> tuple[dict, list]:
    """What one iteration of train.ppo_iteration did, from its Buffer: the metrics (means over
    all ranks' episodes, each with its denominator) and one record per episode (all ranks',
    rank order). dtype: the base weights' (the sampler check's tolerance depends on it)."""
    examples, rollouts, rewards, flipped, kl, keep, weights = (buf.examples, buf.rollouts, buf.rewards, buf.flipped,
                                                              buf.kl, buf.keep, buf.weights)
    n_kept = buf.n_kept
    influence = (influence_metrics(buf, dist) | critic_metrics(cfg, buf, dist)
                 | sampler_drift(rollouts, dtype, dist))
    update = {"skipped": True} if buf.update is None else update_metrics(cfg, buf, dist)
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
    sums = dict(zip(("reward", "correct", "unparsed", "truncated", "tokens", "episodes", "kl", "generated"), dist.sum(torch.tensor(
        [rewards.sum().item(), sum(correct), sum(a is None for a in answers), rollouts.truncated.sum().item(),
         mask.sum().item(), len(rollouts), 0.0 if kl is None else kl.sum().item(), buf.generated_tokens],
        dtype=torch.float64, device=mask.device)).tolist()))
    per_episode = {k: sums[k] / sums["episodes"] for k in ("reward", "correct", "unparsed", "truncated", "tokens")}
    metrics = {
        "reward": per_episode["reward"], "accuracy": per_episode["correct"], "unparsed": per_episode["unparsed"],
        "truncated": per_episode["truncated"], "response_tokens": per_episode["tokens"],
        "episodes": int(sums["episodes"]), "kept": n_kept, "kept_fraction": n_kept / sums["episodes"],
        # every response token sampled, those of episodes a --selection rule dropped included: the token budget's count
        "generated_tokens": int(sums["generated"]),
        # The KL to pi_ref, mean over all response tokens; logged only where it is computed
        # (--kl-beta > 0): at beta 0 the reference pass is skipped.
        **({} if kl is None else {"kl": sums["kl"] / max(sums["tokens"], 1.0)}),
        **influence, **update,
    }
    if labels is not None:
        counts = dict(zip(LABELS, dist.sum(torch.tensor([labels.count(name) for name in LABELS], dtype=torch.float64,
                                                        device=mask.device)).tolist()))
        n_correct = counts["faithful"] + counts["unfaithful"]
        # shares of all episodes, and the unfaithful share of the correct ones (None: none correct)
        metrics |= {f"{name}_fraction": counts[name] / sums["episodes"] for name in LABELS}
        metrics["unfaithful_of_correct"] = counts["unfaithful"] / n_correct if n_correct else None
    if cfg.reward_noise > 0:
        metrics |= noise_metrics(dist.cat(torch.tensor(flipped, dtype=torch.float32, device=mask.device)).bool(),
                                 dist.cat(keep.float()).bool(),
                                 None if buf.scores is None else dist.cat(buf.scores))
    if warnings:
        metrics["warnings"] = list(warnings)
    scores = None if buf.scores is None else buf.scores.tolist()
    episodes = [{"iteration": it + 1, "prompt": examples[j].question, "gold": golds[i], "response": rollouts.responses[i],
                 "answer": answers[i], "reward": rewards[i].item(), "truncated": bool(rollouts.truncated[i]),
                 "score": None if buf.scores is None else scores[i],
                 "kept": bool(keep[i]), "weight": weights[i].item(), "flipped": flipped[i],
                 "reasoning": None if labels is None else labels[i]}
                for i, j in enumerate(rollouts.prompt_index)]
    return metrics, dist.gather_objects(episodes)


def influence_metrics(buf, dist=SINGLE) -> dict:
    """The scores and the filter's weights over all ranks' episodes ({} without influence):
    their mean, range and positive share, the norm of g_val, and the effective number of
    episodes behind the update (Kish): (sum w)^2 / sum w^2, |D'| when every kept weight is 1,
    fewer when a few large scores carry the weight."""
    if buf.scores is None:
        return {}
    scores, keep, weights = dist.cat(buf.scores), dist.cat(buf.keep.float()).bool(), dist.cat(buf.weights)
    ess = (weights.sum() ** 2 / (weights ** 2).sum()).item() if bool(keep.any()) else 0.0
    return {"weight_ess": ess, "score_mean": scores.mean().item(), "score_min": scores.min().item(),
            "score_max": scores.max().item(), "positive_fraction": (scores > 0).float().mean().item(),
            "g_val_norm": buf.g_val_norm}


def critic_metrics(cfg: Config, buf, dist=SINGLE) -> dict:
    """The critic's health: the mean advantage before whitening (over all response tokens) and
    the explained variance of V_old against the returns (None: no critic, or constant returns)."""
    rollouts, mask = buf.rollouts, buf.rollouts.response_mask
    ev = (float("nan") if cfg.advantage == "grpo" else
          explained_variance(rollouts.values, buf.returns, mask, reduce_sum=dist.sum))
    n_tokens = dist.sum(mask.sum()).clamp(min=1.0)
    return {"advantage_mean": (dist.sum((buf.raw_advantages * mask).sum()) / n_tokens).item(),
            "explained_variance": None if math.isnan(ev) else ev}


def update_metrics(cfg: Config, buf, dist=SINGLE) -> dict:
    """From what train.ppo_update recorded: unweighted means over every visit of a kept episode
    (the value loss: of an episode in the value loss) in every epoch, all ranks; pi_theta / pi_old
    over the kept tokens of the first step, before any step (1 up to rounding: anything else
    means the old log-probs are not those of the policy being updated); the first step's
    gradient norm before clipping; the SFT term's mean NLL (--sft-coef)."""
    rollouts, keep, update = buf.rollouts, buf.keep, buf.update
    device = rollouts.response_mask.device
    sums = {"policy_loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "policy_visits": 0.0,
            "value_loss": 0.0, "value_visits": 0.0}
    ratio_sum, ratio_count, ratio_max = 0.0, 0.0, 0.0
    for step, micro, logprobs, pg, vf, ent in update["record"]:
        part = rollouts.select(micro)
        kept, in_value = keep[micro].float(), update["value_on"][micro].float()          # (n,) each
        sums["policy_loss"] += (kept * pg).sum().item()
        sums["entropy"] += (kept * ent).sum().item()
        sums["clip_fraction"] += (kept * clip_fraction(logprobs, part.old_logprobs, part.response_mask,
                                                       cfg.clip_eps)).sum().item()
        sums["approx_kl"] += (kept * approx_kl(logprobs, part.old_logprobs, part.response_mask)).sum().item()
        sums["policy_visits"] += kept.sum().item()
        sums["value_loss"] += (in_value * vf).sum().item()
        sums["value_visits"] += in_value.sum().item()
        if step == 0:
            ratio = torch.exp(logprobs - part.old_logprobs)[part.response_mask.bool() & keep[micro, None]]
            ratio_sum, ratio_count = ratio_sum + ratio.sum().item(), ratio_count + ratio.numel()
            ratio_max = max(ratio_max, ratio.max().item() if ratio.numel() else 0.0)
    sums = dict(zip(sums, dist.sum(torch.tensor(list(sums.values()), dtype=torch.float64, device=device)).tolist()))
    policy_visits, value_visits = sums.pop("policy_visits"), sums.pop("value_visits")
    as_tensor = lambda *xs: torch.tensor(xs, dtype=torch.float64, device=device)  # noqa: E731
    ratio_sum, ratio_count = dist.sum(as_tensor(ratio_sum, ratio_count)).tolist()
    ratio_max = dist.cat(as_tensor(ratio_max)).max().item()                              # over ranks
    out = {k: v / max(policy_visits, 1.0) for k, v in sums.items() if k != "value_loss"}
    sft = update["sft_losses"]
    return out | {"value_loss": sums["value_loss"] / value_visits if value_visits else None,
                  "optimizer_steps": update["steps"], "ratio_first_mean": ratio_sum / max(ratio_count, 1.0),
                  "ratio_first_max": ratio_max, "grad_norm_first": update["grad_norms"][0],
                  **({"sft_loss": sum(sft) / len(sft)} if sft else {})}


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


def noise_metrics(flipped: torch.Tensor, keep: torch.Tensor, scores: torch.Tensor | None) -> dict:
    """With --reward-noise: the share of flipped rewards, and how well the filter finds them:
    flip_auc, the AUC of the influence scores for "not flipped" (detection_auc; 0.5 is
    chance), and the share of flipped episodes among the dropped and among the kept. All (N,)
    over all ranks' episodes; scores None without influence."""
    share = lambda sel: flipped[sel].float().mean().item() if bool(sel.any()) else None   # noqa: E731
    metrics = {"flipped_fraction": flipped.float().mean().item()}
    if scores is not None:
        metrics |= {"flip_auc": detection_auc(scores, ~flipped), "flipped_share_dropped": share(~keep),
                    "flipped_share_kept": share(keep)}
    return metrics



# How far the sampler's log-probs of its own tokens may be from pi_old's before a warning, in
# nats per token (largest over the batch's response tokens). Both are log-softmax(logits / T) of
# the same weights, once through the KV-cache decode and once through the full forward, so they
# differ by rounding alone. Measured on CPU (bench/sampler_drift.py, docs/reliability.md): a
# largest gap of 1.4e-5 (tiny world) and 1.7e-5 (Gemma-3-270M) in fp32, exactly 0 in bf16 on the
# CPU's kernels. Our thresholds: 1e-3 in fp32, about 60 times the largest gap measured; 0.5 in
# bf16, not measured on a GPU, where the decode and the full forward take different attention
# kernels: a bf16 logit of size 20-30 carries about 0.1 of rounding, so 0.5 nats is a few times
# that. A gap beyond it means the tokens were not drawn from the distribution PPO takes as pi_old.
SAMPLER_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.5}


def sampler_drift(rollouts, dtype: torch.dtype, dist=SINGLE) -> dict:
    """|log pi_sampler(a_t) - log pi_old(a_t)| over all ranks' response tokens: the largest and
    the mean, and the tolerance for the model's dtype. pi_sampler is what the sampler computed
    as it drew the token (rollout.sample); pi_old is the full forward that PPO's ratio uses."""
    mask = rollouts.response_mask
    gap = (rollouts.sampler_logprobs - rollouts.old_logprobs).abs() * mask                     # (N, T)
    gap_sum, count = dist.sum(torch.stack([gap.sum().double(), mask.sum().double()])).tolist()
    largest = dist.cat(gap.max().reshape(1).double()).max().item()
    return {"sampler_gap_max": largest, "sampler_gap_mean": gap_sum / max(count, 1.0),
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



class Timer:
    """Seconds per named phase of an iteration."""
    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, name):
        t0 = time.time()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0


def evaluation_due(cfg: Config, it: int, stop: bool) -> bool:
    """Greedy evaluation after every --eval-every iterations, after the last and at a stop."""
    return bool(cfg.eval_every) and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations or stop)


def start_line(cfg: Config, m: dict) -> str:
    """The line of the evaluation before training."""
    unf, faithful = m.get("eval_unfaithful_of_correct"), m.get("eval_faithful_accuracy")
    return (f"[it   0/{cfg.iterations}] eval acc {m['eval_accuracy']:.3f} ({m['eval_n']} problems, before training)"
            + ("" if unf is None else f" unf {unf:.2f}") + ("" if faithful is None else f" faithful acc {faithful:.3f}"))
