"""The training log's window (§5): what the updates since the last log line add up to.

Every ``log_every`` updates the window becomes one point of the training curve (label-smoothed
loss and NLL per target token, §5.4) and starts over. A checkpoint taken while the window is open
carries its sums (``state_dict``), so that a resumed run, after a kill or a graceful stop, logs
the very point an uninterrupted run logs: a stop never writes a partial window into the curve.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class LogWindow:
    """Sums over the updates since the last log line, on the training device (no host sync per update)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), device=self.device)
        self.nll = torch.zeros((), device=self.device)
        # Target tokens of this rank in the window's applied updates: on the device, which alone
        # knows which updates were applied until the host reads the ledger (``update_ledger``).
        self.tokens = torch.zeros((), dtype=torch.int64, device=self.device)
        self.steps = 0           # applied updates in the window, counted when the host reads the ledger
        # For the speed only (a property of the machine): tokens this process trained since ``started``.
        self.started = time.monotonic()
        self.tokens_here = 0

    def restart_clock(self) -> None:
        """Measure the speed from now (a resumed window's sums came from another process)."""
        self.started, self.tokens_here = time.monotonic(), 0

    def add(self, loss_sum: torch.Tensor, nll_sum: torch.Tensor, tokens: int, applied: torch.Tensor) -> None:
        """One update's sums, counted only where ``applied`` (a device bool): no read-back."""
        self.loss += torch.where(applied, loss_sum, 0.0)
        self.nll += torch.where(applied, nll_sum, 0.0)
        self.tokens += applied * tokens
        self.tokens_here += tokens   # the speed counts every update's work, applied or not

    def count_applied(self, updates: int) -> None:
        """``updates`` more applied updates in the window, as the ledger's read says."""
        self.steps += updates

    def tokens_per_s(self) -> float:
        return self.tokens_here / max(time.monotonic() - self.started, 1e-9)

    def state_dict(self) -> dict[str, Any] | None:
        """The open window's sums (bit for bit), or None when it is empty: a checkpoint on the log
        grid (``log_every`` divides ``checkpoint_every_steps``) then holds no entry for it at all."""
        if not self.steps:
            return None
        return {"loss": self.loss.detach().cpu(), "nll": self.nll.detach().cpu(),
                "tokens": int(self.tokens), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.reset()
        if state:
            self.loss = state["loss"].to(self.device).clone()
            self.nll = state["nll"].to(self.device).clone()
            self.tokens.fill_(int(state["tokens"]))
            self.steps = int(state["steps"])
