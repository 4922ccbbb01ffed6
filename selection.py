"""Rollout selection: which sampled episodes an iteration's update learns from, one rule a function.

A rule decides, before the advantages, which prompts are sampled (and whether more are) and
which of the sampled episodes go on to the update. train.ppo_iteration calls it once:

    rule(cfg, sample, state, gradients) -> train.Buffer

`sample(k, n, keep=None, validation=False)` samples n responses to each prompt of round k of the
iteration and rewards them: k = 0 is the iteration's own --prompts-per-iter prompts, where every
rule starts; k >= 1 are further batches, from a stream of their own, so that a rule that asks for
more takes no later iteration's (draws.iteration_prompts); k also seeds the sampler and the planted
noise. `keep(examples)`, if given, returns the prompts to sample among them, at least one (a rule
that skips some before spending rollouts on them); validation=True samples --gradalign-val
validation problems instead (their rewards never flipped). It returns a train.Buffer holding
examples, rollouts (rollouts.prompt_index into examples), rewards, flipped and generated_tokens.
A rule returns such a Buffer: the episodes the update learns from, `generated_tokens` counting
every response token it sampled (dropped episodes included). `gradients(buffer)` returns each
prompt's policy gradient at theta_old, (prompts, P), with the recipe's advantages over that buffer
(prompt_gradients; only GradAlign asks for it). `state` is the rule's own dict (JSON), kept from
iteration to iteration and saved in every checkpoint, so that a resumed run goes on with it; what a
rule puts in state["log"] goes into the iteration's metrics (metrics.jsonl, TensorBoard), not into
the checkpoint. Every draw comes from (seed, iteration, round): a resumed run draws the same.

What follows a rule is the same for every rule: pi_old and V_old of the episodes it returned,
the recipe's advantages over those episodes only (GAE whitened over them, or with --advantage
grpo each prompt's statistics over its returned samples: never over episodes the rule
dropped), then the update. The papers of DAPO and PODS used GRPO's group advantages; here
every rule gets the recipe's GAE unless --advantage grpo is given.

    --selection none    every_episode: the template, the iteration's prompts and every episode
    --selection dapo    dynamic_sampling: DAPO's dynamic sampling
    --selection pods    max_variance_down_sampling: PODS
    --selection greso   selective_rollouts: GRESO, prompts skipped by their reward history
    --selection gradalign  gradient_alignment: GradAlign, prompts chosen by their gradient's cosine

I-PPO's filter (--influence on) acts later, on the scores (train.select_episodes); the rules
here replace it (config.py refuses both at once). To add a rule: copy every_episode, name it in
RULES and in config.py's --selection choices, and test it on a hand-made batch as
tests/test_selection.py does.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from draws import SKIPS, derived_seed
from influence import group_gradients
from rollout import old_and_ref_logprobs


def every_episode(cfg, sample, state, gradients=None):
    """The template rule, which selects nothing away: the iteration's own prompts,
    --samples-per-prompt responses each, every episode kept (plain PPO's batch, and I-PPO's)."""
    return sample(0, cfg.samples_per_prompt)


def dynamic_sampling(cfg, sample, state, gradients=None, keep=None):
    """DAPO's dynamic sampling (arXiv 2503.14476, section 3.2 and Algorithm 1): a prompt's group
    of --samples-per-prompt answers is kept only if its rewards are not all equal (some but not
    all answers right: under GRPO such a group has zero advantage and teaches nothing), and
    further batches of prompts are sampled until --prompts-per-iter groups are kept, at most
    --dapo-rounds batches beyond the first; the first --prompts-per-iter groups kept, in the
    order sampled, are the batch.

    Our choices where the paper leaves them open or this recipe differs: the rounds are bounded
    (the paper samples until the batch is full); when they run out the batch holds the groups
    found, and when none was found it is the iteration's own batch, as PPO's would be; "all
    equal" is judged on the reward as trained on (after planted noise and the truncation
    penalty); advantages are the recipe's GAE over the kept groups (the paper: GRPO's;
    --advantage grpo)."""
    kept, first, generated = [], None, 0
    for k in range(1 + cfg.dapo_rounds):
        batch = sample(k, cfg.samples_per_prompt, keep)
        first, generated = first or batch, generated + batch.generated_tokens
        kept += [(batch, j) for j in range(len(batch.examples)) if informative(batch, j)][:cfg.prompts_per_iter - len(kept)]
        if len(kept) == cfg.prompts_per_iter:
            break
    state["log"] = {"selection_rounds": k + 1, "selection_groups_found": len(kept)}
    return replace(join_groups(kept) if kept else first, generated_tokens=generated)


def selective_rollouts(cfg, sample, state, gradients=None):
    """GRESO (arXiv 2506.02177; its public code, Infini-AI-Lab/GRESO, for the details): DAPO's
    dynamic sampling, with prompts skipped before any rollout is spent on them. A prompt whose
    answers were all right the last c times in a row it was sampled is skipped with probability
    1 - max(p_easy^c, 0.01); one whose answers were all wrong the last c times, with
    1 - max(p_hard^c, 0.01); a prompt not seen before is never skipped. After each iteration
    p_easy moves by 0.01 towards --greso-target / 3 as the share of all-right prompts among those
    sampled (down if the share is at or above it: skip more; up if below), and p_hard towards
    2 --greso-target / 3 with the all-wrong share, each within [0.05, 0.95], from 0.5.

    State (checkpointed): each prompt's streaks [all right, all wrong] by its row (`where`),
    p_easy, p_hard, the iterations done, and the prompts skipped and sampled so far (the
    rollouts saved: state["skipped"] / (state["skipped"] + state["sampled"])).
    Our choices: when every prompt of a round is drawn to be skipped, its first is sampled all
    the same (the code moves on to the next batch: ours would spend a round on nothing); "all
    right" is every reward of the group above 0 and "all wrong" every reward at most 0 (the
    code's 0.98 and 0.11 thresholds on a mean reward in [0, 1]); p starts to move once some
    prompt is sampled a second time (the code: after the first epoch); the skip draws come from
    (seed, iteration); advantages are the recipe's GAE (the paper: GRPO's)."""
    state.setdefault("p_easy", 0.5), state.setdefault("p_hard", 0.5), state.setdefault("streaks", {})
    draw = torch.Generator().manual_seed(derived_seed(cfg.seed, state.setdefault("iterations", 0), SKIPS))
    seen = {"easy": 0, "hard": 0, "sampled": 0, "skipped": 0, "repeat": False}

    def keep(examples):
        chosen = []
        for e in examples:
            easy, hard = state["streaks"].get(e.where, [0, 0])
            p, c = (state["p_easy"], easy) if easy else (state["p_hard"], hard)
            seen["repeat"] |= e.where in state["streaks"]
            if c and float(torch.rand(1, generator=draw)) < 1 - max(p ** c, 0.01):
                seen["skipped"] += 1
            else:
                chosen.append(e)
        if not chosen:   # every prompt of the round drawn to be skipped: the first is sampled all the same
            seen["skipped"] -= 1
            chosen.append(examples[0])
        return chosen

    def record(k, n, keep_=None):   # sample, and update each sampled prompt's streaks
        batch = sample(k, n, keep_)
        for j, e in enumerate(batch.examples):
            rewards = batch.rewards[torch.as_tensor(batch.rollouts.prompt_index, device=batch.rewards.device) == j]
            right, wrong = bool((rewards > 0).all()), bool((rewards <= 0).all())
            easy, hard = state["streaks"].get(e.where, [0, 0])
            state["streaks"][e.where] = [easy + 1 if right else 0, hard + 1 if wrong else 0]
            seen["easy"], seen["hard"], seen["sampled"] = seen["easy"] + right, seen["hard"] + wrong, seen["sampled"] + 1
        return batch

    batch = dynamic_sampling(cfg, record, state, keep=keep)
    state["iterations"] += 1
    state["skipped"] = state.get("skipped", 0) + seen["skipped"]
    state["sampled"] = state.get("sampled", 0) + seen["sampled"]
    state["adapting"] = state.get("adapting", False) or seen["repeat"]
    if state["adapting"] and seen["sampled"]:
        for name, share, target in (("p_easy", seen["easy"], cfg.greso_target / 3),
                                    ("p_hard", seen["hard"], 2 * cfg.greso_target / 3)):
            step = -0.01 if share / seen["sampled"] >= target else 0.01
            state[name] = round(min(max(state[name] + step, 0.05), 0.95), 6)
    state["log"] |= {"selection_skipped": seen["skipped"], "selection_p_easy": state["p_easy"],
                     "selection_p_hard": state["p_hard"]}
    return batch


def informative(batch, j: int) -> bool:
    """Are the rewards of prompt j's answers not all equal?"""
    rewards = batch.rewards[torch.as_tensor(batch.rollouts.prompt_index, device=batch.rewards.device) == j]
    return bool((rewards != rewards[0]).any())


def max_variance_down_sampling(cfg, sample, state, gradients=None):
    """PODS with max-variance down-sampling (arXiv 2504.13818): sample --pods-samples n answers
    to each of the iteration's prompts and update on the m = --samples-per-prompt of each prompt
    whose rewards have the largest variance. The best subset is the k highest rewards and the
    m - k lowest for some k (the paper's result), so each group is sorted once and its m + 1
    candidates compared: O(n log n) (max_variance_subset).

    Our choices: ties in the variance go to the smallest k, ties between equal rewards follow one
    stable ascending sort (the lowest part takes the earliest sampled, the highest the latest);
    advantages are the recipe's GAE over the kept answers (the paper: GRPO's over the kept
    subset; --advantage grpo); PODS samples n / m times PPO's tokens an iteration (the token
    budget counts them all)."""
    batch = sample(0, cfg.pods_samples)
    index = torch.as_tensor(batch.rollouts.prompt_index)
    keep = []
    for j in range(len(batch.examples)):
        rows = torch.nonzero(index == j).squeeze(-1)
        keep += rows[max_variance_subset(batch.rewards[rows].cpu(), cfg.samples_per_prompt)].tolist()
    keep = sorted(keep)
    return replace(batch, rollouts=batch.rollouts.select(keep), rewards=batch.rewards[torch.tensor(keep)],
                   flipped=[batch.flipped[i] for i in keep])


def gradient_alignment(cfg, sample, state, gradients):
    """GradAlign (arXiv 2602.21492; its public code, StigLidu/GradAlign, for the details): sample
    --gradalign-rounds batches of candidate prompts, --samples-per-prompt answers each, and keep
    the --prompts-per-iter candidates whose policy gradient has the largest cosine with the
    validation gradient: the policy gradient of the model's own answers to --gradalign-val
    validation problems (a fresh draw each iteration, rewarded against their gold answers).

    How it differs from I-PPO (influence.py): it chooses prompts, not episodes; its validation
    gradient is a policy gradient of the model's own answers, not the SFT gradient of reference
    solutions; it ranks by cosine, not by a dot product; it does not reweight.
    Our choices: it selects every iteration, from 2 batches by default (the paper ranks a chunk of
    M candidates and trains several steps on the best M / q); each prompt's gradient is that of
    the mean over its answers of the PPO loss with the recipe's advantages over the candidates
    (GAE whitened over them: a group whose rewards are all equal still has nonzero advantages,
    through the critic; the paper: GRPO's, where such a group's gradient is 0), and the
    validation gradient is the sum of the validation prompts' (a cosine does not see the scale);
    a zero gradient has cosine 0 (the code: similarity 0 for a group whose advantages are all
    0); ties go to the earlier sampled; the kept prompts keep their sampled order. The paper
    says cosine; the code's single-process similarity returns the plain dot product (its
    normalisation is commented out), its multi-GPU one normalises both gradients, a cosine.
    The token budget counts the validation answers too."""
    rounds = [sample(k, cfg.samples_per_prompt) for k in range(cfg.gradalign_rounds)]
    candidates = join_groups([(batch, j) for batch in rounds for j in range(len(batch.examples))])
    answers = sample(0, cfg.samples_per_prompt, validation=True)
    alignment = cosines(gradients(candidates), gradients(answers).sum(0))              # (candidates,)
    chosen = torch.argsort(alignment, descending=True, stable=True)[:cfg.prompts_per_iter].sort().values
    state["log"] = {"selection_cosine_kept": alignment[chosen].mean().item(),
                    "selection_cosine_candidates": alignment.mean().item()}
    return replace(join_groups([(candidates, j) for j in chosen.tolist()]),
                   generated_tokens=sum(batch.generated_tokens for batch in rounds) + answers.generated_tokens)


def prompt_gradients(cfg, policy, buf, compute_advantages, timer) -> torch.Tensor:
    """The rules' `gradients(buf)`: each prompt's policy gradient at theta_old (influence.group_gradients),
    from pi_old, V_old and the recipe's advantages (train.compute_advantages) over the episodes of buf.
    Returns (prompts, P)."""
    with timer("influence"):
        buf.rollouts.old_logprobs, buf.rollouts.values, buf.rollouts.ref_logprobs = old_and_ref_logprobs(
            policy, buf.rollouts, cfg.temperature, cfg.gen_batch_size, ref=cfg.kl_beta > 0)
        advantages = compute_advantages(cfg, buf)[0]
        return group_gradients(policy, buf.rollouts, advantages, clip_eps=cfg.clip_eps, temperature=cfg.temperature)


def cosines(grads: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """cos(grads_j, g) for each row j, in float64; 0 where either vector is 0. (G, P), (P,) -> (G,)"""
    grads, g = grads.double(), g.double()
    norms = grads.norm(dim=1) * g.norm()
    return torch.where(norms > 0, (grads @ g) / norms.clamp(min=1e-300), torch.zeros_like(norms))


def max_variance_subset(rewards: torch.Tensor, m: int) -> torch.Tensor:
    """The positions of the m of these n rewards with the largest variance, ascending: in one
    stable ascending sort of the rewards, the m + 1 candidates are its first m - k with its last
    k, k = 0..m; the first with the largest variance wins."""
    order = torch.sort(rewards.double(), stable=True).indices
    n, best, best_var = len(rewards), None, -1.0
    for k in range(m + 1):
        chosen = torch.cat([order[:m - k], order[n - k:]])
        var = rewards[chosen].double().var(unbiased=False).item()
        if var > best_var + 1e-12:
            best, best_var = chosen, var
    return best.sort().values


def join_groups(groups: list) -> object:
    """One Buffer of the groups [(buffer, prompt j of it)], in that order, prompts renumbered."""
    parts, examples, rewards, flipped = [], [], [], []
    for batch, j in groups:
        rows = torch.nonzero(torch.as_tensor(batch.rollouts.prompt_index) == j).squeeze(-1)
        part = batch.rollouts.select(rows)
        part.prompt_index = [len(examples)] * len(rows)
        examples.append(batch.examples[j])
        parts.append(part)
        rewards.append(batch.rewards[rows.to(batch.rewards.device)])
        flipped += [batch.flipped[i] for i in rows.tolist()]
    return replace(groups[0][0], examples=examples, rollouts=concatenate(parts), rewards=torch.cat(rewards),
                   flipped=flipped)


def concatenate(parts: list):
    """The episodes of several Rollouts as one: prompts left-padded and responses right-padded
    to the widest part (token 0, mask 0 in the new padding: the masks keep it out of every
    computation). Only what sampling sets is joined; pi_old and the rest come later."""
    width_p = max(p.prompt_ids.shape[1] for p in parts)
    width_t = max(p.response_ids.shape[1] for p in parts)

    def pad(t, width, left):
        zeros = torch.zeros(t.shape[0], width - t.shape[1], dtype=t.dtype, device=t.device)
        return torch.cat([zeros, t] if left else [t, zeros], dim=1)

    return type(parts[0])(
        prompt_ids=torch.cat([pad(p.prompt_ids, width_p, True) for p in parts]),
        prompt_mask=torch.cat([pad(p.prompt_mask, width_p, True) for p in parts]),
        response_ids=torch.cat([pad(p.response_ids, width_t, False) for p in parts]),
        response_mask=torch.cat([pad(p.response_mask, width_t, False) for p in parts]),
        sampler_logprobs=torch.cat([pad(p.sampler_logprobs, width_t, False) for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        prompt_index=[i for p in parts for i in p.prompt_index],
        responses=[r for p in parts for r in p.responses])


RULES = {"none": every_episode, "dapo": dynamic_sampling, "pods": max_variance_down_sampling,
         "greso": selective_rollouts, "gradalign": gradient_alignment}
