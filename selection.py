"""Rollout selection: which sampled episodes an iteration's update learns from, one rule a function.

A rule decides, before the advantages, which prompts are sampled (and whether more are) and
which of the sampled episodes go on to the update. train.ppo_iteration calls it once:

    rule(cfg, sample) -> train.Buffer

`sample(k, n)` samples n responses to each prompt of round k of the iteration and rewards
them: k = 0 is the iteration's own --prompts-per-iter prompts, where every rule starts; k >= 1
are further batches, from a stream of their own, so that a rule that asks for more takes no
later iteration's (draws.iteration_prompts); k also seeds the sampler and the planted noise.
It returns a train.Buffer holding examples, rollouts (rollouts.prompt_index into examples),
rewards, flipped and generated_tokens. A rule returns such a Buffer: the episodes the update
learns from, `generated_tokens` counting every response token it sampled (dropped episodes
included). Every draw comes from (seed, iteration, round): a resumed run draws the
same.

What follows a rule is the same for every rule: pi_old and V_old of the episodes it returned,
the recipe's advantages over those episodes only (GAE whitened over them, or with --advantage
grpo each prompt's statistics over its returned samples: never over episodes the rule
dropped), then the update. The papers of DAPO and PODS used GRPO's group advantages; here
every rule gets the recipe's GAE unless --advantage grpo is given.

    --selection none    every_episode: the template, the iteration's prompts and every episode
    --selection dapo    dynamic_sampling: DAPO's dynamic sampling
    --selection pods    max_variance_down_sampling: PODS

I-PPO's filter (--influence on) acts later, on the scores (train.select_episodes); the rules
here replace it (config.py refuses both at once). To add a rule: copy every_episode, name it in
RULES and in config.py's --selection choices, and test it on a hand-made batch as
tests/test_selection.py does.
"""

from __future__ import annotations

from dataclasses import replace

import torch


def every_episode(cfg, sample):
    """The template rule, which selects nothing away: the iteration's own prompts,
    --samples-per-prompt responses each, every episode kept (plain PPO's batch, and I-PPO's)."""
    return sample(0, cfg.samples_per_prompt)


def dynamic_sampling(cfg, sample):
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
        batch = sample(k, cfg.samples_per_prompt)
        first, generated = first or batch, generated + batch.generated_tokens
        kept += [(batch, j) for j in range(len(batch.examples)) if informative(batch, j)][:cfg.prompts_per_iter - len(kept)]
        if len(kept) == cfg.prompts_per_iter:
            break
    return replace(join_groups(kept) if kept else first, generated_tokens=generated)


def informative(batch, j: int) -> bool:
    """Are the rewards of prompt j's answers not all equal?"""
    rewards = batch.rewards[torch.as_tensor(batch.rollouts.prompt_index, device=batch.rewards.device) == j]
    return bool((rewards != rewards[0]).any())


def max_variance_down_sampling(cfg, sample):
    """PODS with max-variance down-sampling (arXiv 2504.13818): sample --pods-samples n answers
    to each of the iteration's prompts and update on the m = --samples-per-prompt of each prompt
    whose rewards have the largest variance. The best subset is the k highest rewards and the
    m - k lowest for some k (the paper's result), so each group is sorted once and its m + 1
    candidates compared: O(n log n) (max_variance_subset).

    Our choices: ties in the variance go to the smallest k, ties between equal rewards follow one
    stable ascending sort (the lowest part takes the earliest sampled, the highest the latest);
    advantages are the recipe's GAE over the kept answers (the paper:
    GRPO's over the kept subset; --advantage grpo); PODS samples n / m times PPO's tokens an
    iteration (the token budget counts them all)."""
    batch = sample(0, cfg.pods_samples)
    index = torch.as_tensor(batch.rollouts.prompt_index)
    keep = []
    for j in range(len(batch.examples)):
        rows = torch.nonzero(index == j).squeeze(-1)
        keep += rows[max_variance_subset(batch.rewards[rows].cpu(), cfg.samples_per_prompt)].tolist()
    keep = sorted(keep)
    return replace(batch, rollouts=batch.rollouts.select(keep), rewards=batch.rewards[torch.tensor(keep)],
                   flipped=[batch.flipped[i] for i in keep])


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


RULES = {"none": every_episode, "dapo": dynamic_sampling, "pods": max_variance_down_sampling}
