"""Label-smoothed cross-entropy (§5.4, eps_ls = 0.1), ignoring padding."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class LossOutput(NamedTuple):
    """Summed losses over the non-pad target tokens, and how many there were."""

    loss: Tensor  # label-smoothed, what is optimised
    nll: Tensor  # plain negative log-likelihood, for perplexity (no gradient)
    n_tokens: Tensor


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, pad_id: int, epsilon: float = 0.1) -> LossOutput:
    """Label smoothing (§5.4): cross-entropy against (1 - eps) on the reference token plus eps
    spread uniformly over the vocabulary (Szegedy et al., 2016), summed over non-pad tokens.

    The arithmetic is that of PyTorch's ``cross_entropy`` with ``label_smoothing`` (a log-softmax
    in the logits' dtype with float accumulation: on CPU 4x faster than one in float32), spelled
    out so that the plain negative log-likelihood comes from the same log-softmax instead of a
    second pass over the (tokens x V) logits (3% of a training step on CPU).

    Args:
        logits: (B, T, V); target: (B, T) ids, positions equal to ``pad_id`` ignored.
    """
    flat_target = target.reshape(-1)
    lprobs = F.log_softmax(logits.flatten(0, -2), dim=-1)
    nll = F.nll_loss(lprobs, flat_target, ignore_index=pad_id, reduction="sum")
    real = flat_target.ne(pad_id)
    # -sum over the vocabulary of log p, over the non-pad positions: the uniform part of the target.
    smooth = -lprobs.sum(dim=-1).masked_fill(~real, 0.0).sum()
    loss = (1.0 - epsilon) * nll + (epsilon / lprobs.size(-1)) * smooth
    return LossOutput(loss.float(), nll.detach().float(), real.sum())
