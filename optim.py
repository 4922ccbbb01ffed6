"""The optimizer and the guard of every phase.

AdamW without weight decay (LoRA tensors at --lr, the value head at --value-lr); a step clips
the global gradient norm to --max-grad-norm. A NaN or inf anywhere stops the run, naming the
iteration, the phase and the tensor, before anything of the iteration is saved
(rundir.last_good_checkpoint_on_fault then names the checkpoint to resume from).

Public: make_optimizer(cfg, policy), clip_and_step(it, cfg, policy, optimizer) -> gradient
norm, require_finite(it, phase, **tensors).
"""

from __future__ import annotations

import math

import torch


def make_optimizer(cfg, policy) -> torch.optim.AdamW:
    """AdamW without weight decay: the LoRA tensors at --lr, the value head at --value-lr."""
    value_head = list(policy.value_head.parameters())
    lora = [p for p in policy.parameters() if p.requires_grad and all(p is not v for v in value_head)]
    return torch.optim.AdamW([{"params": lora, "lr": cfg.lr}, {"params": value_head, "lr": cfg.value_lr}],
                             weight_decay=0.0)


def clip_and_step(it: int, cfg, policy, optimizer) -> float:
    """Clip the global gradient norm to --max-grad-norm (0: no clip) and take the optimizer
    step, unless a gradient is NaN/inf. Returns the norm before clipping."""
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
    require_finite(it, "update", gradient_norm=grad_norm)
    optimizer.step()
    return grad_norm.item()


def require_finite(it: int, phase: str, **tensors: torch.Tensor) -> None:
    """Stop the run on a NaN or inf, naming the iteration, the phase and the tensor (None: not
    computed, skipped). Raised before anything of the iteration is saved, so checkpoints/latest
    stays the last good one."""
    for name, t in tensors.items():
        if t is not None and not bool(torch.isfinite(t).all()):
            raise FloatingPointError(f"iteration {it + 1}: {name} contains NaN/inf ({int((~torch.isfinite(t)).sum())} "
                                     f"of {t.numel()} values) (phase: {phase})")
