"""Every random draw of a run, from (seed, iteration, purpose, rank): a resumed run draws exactly
what the uninterrupted run would have, and torchrun's ranks draw their own shares.

Public:
    derived_seed(seed, iteration, purpose, rank)  the seed of one draw; the purposes below
    batch_indices(n, iteration, batch, seed)      the training rows of an iteration
    iteration_prompts(examples, it, k, cfg)       round k's prompts (k > 0: a selection rule's further ones)
    planted_flips(cfg, it, n, rank)               --reward-noise: which episodes' rewards flip
    filter_draw(seed, it)                         the generator of --random-filter and --shuffle-weights
    validation_rows(seed, it, k, n)               --val-subset (and --gradalign-val): which k of the n validation rows
"""

from __future__ import annotations

import torch

SAMPLING, FILTER, SHUFFLE, MINIBATCHES, NOISE, SFT_ROWS, VAL_ROWS, REFILL, SKIPS, VAL_SAMPLING = 1, 2, 3, 4, 5, 6, 7, 8, 9, 12
ROUND = 10   # round k > 0 of a selection rule draws SAMPLING and NOISE + ROUND * k: no other purpose ends in 1 or 5


def derived_seed(seed: int, iteration: int, purpose: int, rank: int = 0) -> int:
    """Every random draw of an iteration comes from (seed, iteration, purpose, rank), so a
    resumed run draws exactly what the uninterrupted run would have (rank: the torchrun process)."""
    return (seed * 1_000_003 + iteration * 7_919 + purpose + rank * 104_729) % (2**63)


def batch_indices(n_examples: int, iteration: int, batch: int, seed: int, purpose: int = SHUFFLE) -> list[int]:
    """The training rows of an iteration: consecutive slices of a seeded permutation per epoch."""
    out = []
    for position in range(iteration * batch, (iteration + 1) * batch):
        epoch, offset = divmod(position, n_examples)
        order = torch.randperm(n_examples, generator=torch.Generator().manual_seed(derived_seed(seed, epoch, purpose)))
        out.append(int(order[offset]))
    return out


def iteration_prompts(examples: list, it: int, k: int, cfg) -> list:
    """The training prompts of round k of iteration `it`: k = 0 the iteration's own batch; k >= 1
    a selection rule's further batches (selection.py), from a stream of their own, --dapo-rounds
    (--gradalign-rounds - 1) batches an iteration, so that they take no later iteration's prompts."""
    further = cfg.gradalign_rounds - 1 if cfg.selection == "gradalign" else cfg.dapo_rounds
    position, purpose = (it, SHUFFLE) if k == 0 else (it * further + k - 1, REFILL)
    return [examples[i] for i in batch_indices(len(examples), position, cfg.prompts_per_iter, cfg.seed, purpose)]


def filter_draw(seed: int, it: int) -> torch.Generator:
    """The draw of the influence filter's controls (--random-filter, --shuffle-weights) at iteration `it`."""
    return torch.Generator().manual_seed(derived_seed(seed, it, FILTER))


def planted_flips(cfg, it: int, n: int, rank: int = 0, k: int = 0) -> list[bool]:
    """--reward-noise p: which of the iteration's n episodes have their correctness flipped,
    each independently with probability p, from a draw of its own (a resumed run flips the
    same episodes; k: the sampling round, selection.py)."""
    return (torch.rand(n, generator=torch.Generator().manual_seed(derived_seed(cfg.seed, it, NOISE + ROUND * k, rank)))
            < cfg.reward_noise).tolist()


def validation_rows(seed: int, it: int, k: int, n: int) -> torch.Tensor:
    """--val-subset k: the k validation solutions (of n) that iteration `it`'s g_val uses, sorted,
    a fresh draw each iteration."""
    draw = torch.Generator().manual_seed(derived_seed(seed, it, VAL_ROWS))
    return torch.randperm(n, generator=draw)[:k].sort().values
