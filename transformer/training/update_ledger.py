"""Which updates were applied, kept on the training device and read by the host at log points (§5.3).

Eq. 3 gives update n the rate of step n, and an update that is not applied (a non-finite loss, or
an fp16 overflow that the loss scaler skips) is not a step: it moves neither the weights, nor Adam's
state, nor the step count, nor the schedule. Deciding that on the host reads the device back after
every update, and on a GPU the next update then waits for the last one to finish. The ledger keeps
the decision on the device instead:

- the update's skip flag goes to the fused Adam kernel as its ``found_inf`` (the protocol PyTorch's
  loss scaler uses: the kernel leaves parameters and moments alone and takes its step count back);
- the applied count is a device tensor, and the rate of the next update is looked up on the
  device in a table of eq. 3's rates (``plan``) for every step the updates before the next read
  can reach;
- the non-finite count, the step of the first non-finite update since the last read, and the
  gradient norm of the last applied update are device tensors too.

The host reads them all in one copy (``read``) where it needs the step anyway: at a log,
validation or checkpoint step, at the training's length, or at a stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LedgerReading:
    """What the host learns at a read: the applied updates so far, the non-finite updates skipped
    since the last read, and the step the first of them would have made (0: none)."""

    applied: int
    non_finite: int
    first_non_finite_step: int


class UpdateLedger:
    """The device-side record of the updates; ``rate(n)`` is the learning rate of update ``n`` (from 1)."""

    def __init__(self, device: torch.device, applied: int, rate: Callable[[int], float]) -> None:
        self.device = device
        self.rate = rate
        self.applied = torch.tensor(applied, dtype=torch.int64, device=device)
        self.non_finite = torch.zeros((), dtype=torch.int64, device=device)
        self.first_non_finite_step = torch.zeros((), dtype=torch.int64, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float32, device=device)   # of the last applied update
        # float64: the fused kernel then sees the very rate a Python float gives it (same bytes).
        self.lr = torch.zeros((), dtype=torch.float64, device=device)
        self.base = applied
        self.rates = torch.zeros(0, dtype=torch.float64, device=device)

    def plan(self, applied: int, horizon: int) -> None:
        """Rates for updates ``applied + 1`` .. ``applied + horizon``: the host reads the ledger
        again before more than ``horizon`` updates have run since ``applied`` was read."""
        self.base = applied
        rates = [self.rate(applied + 1 + i) for i in range(max(horizon, 1))]
        self.rates = torch.tensor(rates, dtype=torch.float64).to(self.device, non_blocking=True)

    def next_rate(self) -> torch.Tensor:
        """The rate of the next applied update, set on the device (no read-back)."""
        offset = (self.applied - self.base).reshape(1)
        self.lr.copy_(torch.index_select(self.rates, 0, offset).reshape(()))
        return self.lr

    def record(self, skipped: torch.Tensor, non_finite: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Book one update: ``skipped`` (bool) it was not applied, ``non_finite`` (bool) because of a
        non-finite loss (an fp16 overflow is skipped but not non-finite). Returns ``applied`` (bool)."""
        applied = ~skipped
        first = (self.first_non_finite_step == 0) & non_finite
        self.first_non_finite_step = torch.where(first, self.applied + 1, self.first_non_finite_step)
        self.non_finite += non_finite
        self.grad_norm = torch.where(applied, grad_norm.detach().float(), self.grad_norm)
        self.applied += applied
        return applied

    def read(self) -> LedgerReading:
        """One device-to-host copy; the first non-finite step starts over for the next read."""
        applied, non_finite, first = torch.stack(
            [self.applied, self.non_finite, self.first_non_finite_step]).tolist()
        self.non_finite.zero_()
        self.first_non_finite_step.zero_()
        return LedgerReading(applied=applied, non_finite=non_finite, first_non_finite_step=first)
