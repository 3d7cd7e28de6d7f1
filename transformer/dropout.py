"""Dropout (Srivastava et al., 2014), applied as in §5.4, with cheaper random bits on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_INT16_SPAN = 1 << 16


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p).

    On CPU, PyTorch's dropout draws one Bernoulli sample per element (measured here: 4.8 ms
    for 1M elements, a third of a training step); drawing 64 random bits per 4 elements
    and comparing 16-bit lanes with a threshold costs 1.2 ms. ``p`` is then rounded to a
    multiple of 1/65536. Elsewhere PyTorch's fused kernel is used.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(1 << 63), (1 << 63) - 1)
    lanes = words.view(torch.int16)[:n].view(x.shape)
    keep = lanes >= round(p * _INT16_SPAN) - (1 << 15)
    return x * keep * (1.0 / (1.0 - p))


class Dropout(nn.Module):
    """``nn.Dropout`` with the CPU fast path of ``dropout``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
