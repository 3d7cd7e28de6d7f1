"""Optimiser and learning-rate schedule of §5.3."""

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


def make_optimizer(params: Iterable[nn.Parameter], *, betas: tuple[float, float] = (0.9, 0.98),
                   eps: float = 1e-9, weight_decay: float = 0.0, fused: bool | None = None) -> torch.optim.Adam:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (§5.3). The rate is set by the schedule.

    ``fused`` uses PyTorch's fused kernel (one kernel for all parameters) where it exists.
    """
    params = list(params)
    if fused is None:
        fused = all(p.device.type in ("cuda", "cpu") for p in params)
    return torch.optim.Adam(params, lr=1.0, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)


def make_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int,
                   scale: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Eq. 3 as a ``LambdaLR`` over an optimiser whose base rate is 1.0.

    LambdaLR calls the lambda with the number of completed updates; update n (from 1) uses
    the rate of step n.
    """
    for group in optimizer.param_groups:
        group["lr"] = 1.0
        group["initial_lr"] = 1.0
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: inverse_sqrt_lr(done + 1, d_model, warmup_steps, scale))
