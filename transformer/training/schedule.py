"""Optimiser and learning-rate schedule of §5.3, with an optional linear cool-down at the end.

The cool-down is not the paper's: eq. 3 decays as step^-0.5 for ever, which suits a training of
unknown length. A training of a fixed number of updates (``max_steps``) may instead bring the rate
linearly down over its last ``cooldown_steps`` updates, as budgeted training does (Li et al. 2020,
"Budgeted Training", ICLR; the "warm-up, stable, decay" schedules of Hägele et al. 2024, arXiv
2405.18392): the last updates then settle into a minimum rather than keep the noise of the full rate.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def inverse_sqrt_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Learning rate (§5.3, eq. 3): scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Steps count from 1; step 0 is treated as step 1.
    """
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def cooldown_factor(step: int, max_steps: int, cooldown_steps: int) -> float:
    """The multiplier of eq. 3's rate at update ``step`` (from 1): 1 until the last ``cooldown_steps``
    updates of ``max_steps``, then falling linearly, (max_steps - step + 1) / cooldown_steps, to
    1 / cooldown_steps at the last update (never 0: every update moves the weights).
    ``cooldown_steps`` 0: 1 everywhere (eq. 3 alone)."""
    if cooldown_steps <= 0 or step <= max_steps - cooldown_steps:
        return 1.0
    return max(max_steps - step + 1, 1) / cooldown_steps


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0,
                  max_steps: int = 0, cooldown_steps: int = 0) -> float:
    """The rate of update ``step``: eq. 3 (``inverse_sqrt_lr``) times ``cooldown_factor``."""
    return inverse_sqrt_lr(step, d_model, warmup_steps, scale) * cooldown_factor(step, max_steps, cooldown_steps)


def rates_agree(step: int, old: tuple[int, int], new: tuple[int, int]) -> bool:
    """Whether two cool-downs, each (max_steps, cooldown_steps), give updates 1..``step`` the same
    factor: a checkpoint at ``step`` of one is then a point of the other's trajectory too."""
    starts = [m - c if c > 0 else step for m, c in (old, new)]
    return all(cooldown_factor(n, *old) == cooldown_factor(n, *new) for n in range(min(starts) + 1, step + 1))


def make_optimizer(params: Iterable[nn.Parameter], *, betas: tuple[float, float] = (0.9, 0.98),
                   eps: float = 1e-9, weight_decay: float = 0.0, fused: bool | None = None) -> torch.optim.Adam:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (§5.3). The rate is set by the schedule.

    ``weight_decay`` > 0 (not the paper's) is decoupled from the gradient: AdamW (Loshchilov & Hutter
    2019), each weight shrunk by rate x weight_decay at every step, as fairseq's ``--weight-decay``
    does; Adam's own ``weight_decay`` would add it to the gradient, where Adam's scaling undoes it.
    ``fused`` uses PyTorch's fused kernel (one kernel for all parameters) where it exists.
    """
    params = list(params)
    if fused is None:
        fused = all(p.device.type in ("cuda", "cpu") for p in params)
    if weight_decay > 0:
        return torch.optim.AdamW(params, lr=1.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    # weight_decay given as the float 0.0: the param groups (and so checkpoints) hold it as before.
    return torch.optim.Adam(params, lr=1.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)


def make_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int,
                   scale: float = 1.0, max_steps: int = 0,
                   cooldown_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Eq. 3 (with the cool-down of ``cooldown_factor``, if any) as a ``LambdaLR`` over an
    optimiser whose base rate is 1.0.

    LambdaLR calls the lambda with the number of completed updates; update n (from 1) uses
    the rate of step n.
    """
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: learning_rate(done + 1, d_model, warmup_steps, scale, max_steps, cooldown_steps))
