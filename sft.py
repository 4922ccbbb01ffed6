"""Supervised fine-tuning on reference solutions: the --algo sft baseline and the SFT controls.

--algo sft trains the adapters on the training rows' solutions (or, --sft-data val, on exactly
the validation solutions behind g_val); --sft-coef c adds c x the SFT loss of a batch of the
validation solutions to every PPO step (sft_term). The loss is the mean NLL over the batch's
reference tokens at temperature 1.

Public: sft_iteration(it, cfg, policy, tokenizer, optimizer, rows, timer, passes, dist) ->
(metrics, episodes); sft_term(step, cfg, policy, sft_seqs, passes) -> the batch's mean NLL.
"""

from __future__ import annotations

import torch

from distributed import SINGLE, Single
from draws import SFT_ROWS, batch_indices
from optim import clip_and_step, require_finite
from rollout import encode_pairs
from tasks import make_prompt


def sft_iteration(it: int, cfg, policy, tokenizer, optimizer, train_examples, timer, passes,
                  dist: Single = SINGLE) -> tuple[dict, list]:
    """One SFT step: loss = (sum of NLL over the batch's reference tokens) / (their count),
    with the batch (and the count) spread over the ranks under torchrun. `train_examples`: the
    rows it trains on (main passes the validation rows under --sft-data val)."""
    examples = [train_examples[i] for i in batch_indices(len(train_examples), it, cfg.sft_batch_size, cfg.seed)]
    examples = examples[slice(*dist.span(len(examples)))]
    with timer("update"):
        seqs = encode_pairs(tokenizer, [make_prompt(e.question, cfg.dataset) for e in examples],
                            [e.solution for e in examples], device=policy.device)
        n_tokens = dist.sum(seqs.response_mask.sum())                                     # all ranks
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=n_tokens.device)
        for start in range(0, len(seqs), cfg.micro_batch_size):
            nll, _ = passes.sft_nll(policy, seqs.select(torch.arange(start, min(start + cfg.micro_batch_size, len(seqs)))))
            loss = nll.sum() / n_tokens
            require_finite(it, "update", sft_loss=loss)
            loss.backward()
            loss_sum += loss.item()
        dist.sum_grads([p for p in policy.parameters() if p.requires_grad])
        clip_and_step(it, cfg, policy, optimizer)
    return {"sft_loss": dist.sum(loss_sum).item(), "tokens": int(n_tokens)}, []


def sft_term(step: int, cfg, policy, sft_seqs, passes) -> float:
    """--sft-coef c: backward of c x (sum of NLL over a batch of --sft-batch-size validation
    solutions) / (their token count), at temperature 1 as in --algo sft; the batch is the
    `step`-th of the run over a seeded shuffle of the solutions. Returns the mean NLL."""
    rows = batch_indices(len(sft_seqs), step, cfg.sft_batch_size, cfg.seed, purpose=SFT_ROWS)
    nll, n_tokens = passes.sft_nll(policy, sft_seqs.select(rows))
    loss = nll.sum() / n_tokens.sum()
    (cfg.sft_coef * loss).backward()
    return loss.item()
