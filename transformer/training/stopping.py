"""Stopping a training early, every rank at the same update (§5: training on several devices).

A scheduler's SIGTERM (preemption on SLURM or Kubernetes), a Ctrl-C's SIGINT or the wall-clock
budget ``TrainConfig.max_minutes`` reaches the ranks of a ``torchrun`` job an update or more
apart. A rank that left the loop on its own would leave the others waiting in their next
all-reduce, and the job would end as a lost peer instead of a clean checkpoint. So each rank only
*votes*: its vote travels in the all-reduce that already sums the update's target tokens (one
collective per update, no extra synchronisation), and every rank reads the same sum, so all of
them stop after the same update.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the number of ranks: (0, 1) outside ``torch.distributed``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True)
class StopVote:
    """Why a rank (or, once agreed, any rank) wants to stop: a signal, or the clock budget."""

    signal: bool = False
    clock: bool = False

    def __bool__(self) -> bool:
        return self.signal or self.clock


def agree(tokens: int, vote: StopVote, world_size: int, device: torch.device,
          checkpoint_due: bool = False) -> tuple[int, StopVote, bool]:
    """The target tokens of an update summed over ranks, the stop votes of all ranks, and whether
    any rank's clock says a checkpoint is due (``checkpoint_every_minutes``).

    One ``all_reduce`` of four float64 numbers (token count, ranks signalled, ranks out of time,
    ranks due a checkpoint): exact for token counts up to 2**53 and the same sum on every rank,
    hence the same decision. Every rank takes part in writing a checkpoint (``Trainer.save``
    gathers their RNG states), so a checkpoint by the clock is agreed on like a stop.
    With one process there is nothing to agree on.
    """
    if world_size == 1:
        return tokens, vote, checkpoint_due
    summed = torch.tensor([tokens, float(vote.signal), float(vote.clock), float(checkpoint_due)],
                          dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    total, signalled, out_of_time, due = summed.tolist()   # one device-to-host copy
    return int(total), StopVote(signal=signalled > 0, clock=out_of_time > 0), due > 0


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``handler`` (which only records the request: the training loop
    stops at the end of an update) for the duration of the block, then restore the old handlers.
    Outside the main thread Python refuses signal handlers: the block then installs none."""
    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:   # not the main thread
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
