"""Label-smoothed cross-entropy (§5.4, eps_ls = 0.1), ignoring padding; and the same fused with the
pre-softmax projection (§3.4) for training."""

from __future__ import annotations

from collections.abc import Callable
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

    Computed in float32 whatever the logits' dtype: under bf16 autocast the logits are bf16, and
    a log-softmax in bf16 puts ~1e-3 relative error into the reported NLL, perplexity and
    validation figures (bf16 keeps 8 bits of mantissa). The upcast costs a (tokens x V) float32
    copy and a float32 log-softmax, forward and backward (measured on CPU for 2816 x 8000 logits:
    480 ms against 240 ms in bf16); autograd casts the gradient back to the logits' dtype.
    The arithmetic is that of PyTorch's ``cross_entropy`` with ``label_smoothing`` on the float32
    logits, spelled out so that the plain negative log-likelihood comes from the same log-softmax
    instead of a second pass over the (tokens x V) logits (3% of a training step on CPU).

    Args:
        logits: (B, T, V), any floating dtype; target: (B, T) ids, positions equal to ``pad_id`` ignored.
    Returns:
        float32 sums (loss, nll) and the count of non-pad target tokens.
    """
    flat_target = target.reshape(-1)
    lprobs = F.log_softmax(logits.flatten(0, -2).float(), dim=-1)
    nll = F.nll_loss(lprobs, flat_target, ignore_index=pad_id, reduction="sum")
    real = flat_target.ne(pad_id)
    # -sum over the vocabulary of log p, over the non-pad positions: the uniform part of the target.
    smooth = -lprobs.sum(dim=-1).masked_fill(~real, 0.0).sum()
    loss = (1.0 - epsilon) * nll + (epsilon / lprobs.size(-1)) * smooth
    return LossOutput(loss, nll.detach(), real.sum())


# Rows of logits computed at once by ``projected_label_smoothed_cross_entropy``: about 2M float32
# values (8 MB) a chunk on CPU, which stay in the last-level cache between the product that makes
# them, the log-softmax and the gradient (measured on 2 AMD EPYC cores, 1900 x 256 states, V 8000,
# bf16: 256 rows 51 ms against 57 ms at 128 and 71 ms at 512, and 140 ms unfused); GPUs want
# larger products, and a chunk of 64M values (256 MB) is still a fraction of a whole batch's logits.
CHUNK_ELEMENTS = {"cpu": 1 << 21, "cuda": 1 << 26}


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype autocast gives the output projection here: its dtype where autocast is on, else the weight's."""
    device_type = weight.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


def unpadded_rows(flat_target: Tensor, pad_id: int, n_tokens: int) -> Tensor:
    """The positions of ``flat_target`` that are not ``pad_id``, in order, given their count: what
    ``nonzero`` gives, without its wait for a GPU to tell the count (the batch was built on the
    host, which knows it). A stable sort puts them first."""
    return torch.argsort(flat_target.eq(pad_id).to(torch.int8), stable=True)[:n_tokens]


def target_rows(flat_target: Tensor, pad_id: int, n_tokens: int | None) -> Tensor:
    """The positions of ``flat_target`` that are not ``pad_id``: ``nonzero``'s on CPU or where the
    count is unknown, else ``unpadded_rows`` (no read-back from a GPU)."""
    if n_tokens is None or flat_target.device.type == "cpu":
        return flat_target.ne(pad_id).nonzero().squeeze(1)
    return unpadded_rows(flat_target, pad_id, n_tokens)


# What a chunked loss returns: (loss, nll, n_tokens, d loss / d hidden, d loss / d weight), the
# gradients None where it was asked for none.
ChunkedResult = tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]


def _chunked_loss(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, epsilon: float,
                  dtype: torch.dtype, with_grads: bool, n_tokens: int | None = None) -> ChunkedResult:
    """(loss, nll, n_tokens, d loss / d hidden, d loss / d weight) of the rows ``target`` does not pad.

    The logits of ``chunk`` rows at a time, each made in ``dtype`` and read in float32 as the
    unfused loss reads them; their gradient, softmax minus the smoothed target
    (p - (1 - eps) onehot - eps / V), is taken back through the projection in ``dtype`` at once,
    so no (tokens x V) tensor is ever kept.
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    flat_target = target.reshape(-1)
    rows = target_rows(flat_target, pad_id, n_tokens)
    states = flat_hidden.index_select(0, rows).to(dtype)
    targets = flat_target.index_select(0, rows)
    w = weight.to(dtype)
    vocab = w.size(0)
    chunk = max(1, CHUNK_ELEMENTS.get(weight.device.type, CHUNK_ELEMENTS["cuda"]) // vocab)
    loss = torch.zeros((), dtype=torch.float32, device=weight.device)
    nll = torch.zeros((), dtype=torch.float32, device=weight.device)
    grad_states = torch.empty_like(states) if with_grads else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
    for start in range(0, states.size(0), chunk):
        h = states[start:start + chunk]
        y = targets[start:start + chunk, None]
        logits = (h @ w.t()).float()
        lprobs = F.log_softmax(logits, dim=-1)
        nll_rows = -lprobs.gather(1, y).squeeze(1)
        nll += nll_rows.sum()
        # -sum over the vocabulary of log p: the uniform part of the target.
        loss += (1.0 - epsilon) * nll_rows.sum() + (epsilon / vocab) * -lprobs.sum()
        if with_grads:
            # Clamped: exp takes a slow path (15x on this CPU) for arguments below about -87, which
            # log-probabilities under untrained tied embeddings reach at V 8000; e^-80 is 1.8e-35.
            grad = minus_smoothed_target_(lprobs.clamp_(min=-80.0).exp_(), y, epsilon).to(dtype)
            grad_states[start:start + chunk] = grad @ w
            grad_weight += (grad.t() @ h).float()
    grad_hidden = spread_rows(grad_states, rows, hidden) if with_grads else None
    return loss, nll, row_count(rows), grad_hidden, grad_weight


def minus_smoothed_target_(grad: Tensor, y: Tensor, epsilon: float) -> Tensor:
    """``grad`` (rows of probabilities, or of a gradient that holds them) minus label smoothing's
    target (§5.4): (1 - eps) at each row's ``y`` and eps / V everywhere; in place. With ``grad`` = p,
    the cross-entropy's gradient with respect to the logits."""
    grad.sub_(epsilon / grad.size(-1))
    return grad.scatter_add_(1, y, grad.new_full(y.shape, -(1.0 - epsilon)))


def spread_rows(grad_states: Tensor, rows: Tensor, hidden: Tensor) -> Tensor:
    """The gradients of the rows ``rows`` of the flattened ``hidden`` (one per row, in order) as a
    gradient of all of ``hidden``: zero at the rows left out (padding), in ``hidden``'s dtype."""
    grad_hidden = torch.zeros((hidden.numel() // hidden.size(-1), hidden.size(-1)), dtype=torch.float32,
                              device=hidden.device)
    grad_hidden.index_copy_(0, rows, grad_states.float())
    return grad_hidden.view(hidden.shape).to(hidden.dtype)


def row_count(rows: Tensor) -> Tensor:
    """How many rows ``rows`` holds, as a tensor on its device: a fill, not a copy from the host."""
    return torch.full((), rows.numel(), dtype=rows.dtype, device=rows.device)


class _ProjectedLoss(torch.autograd.Function):
    """The output projection and a loss as one autograd node whose gradients ``chunked`` computed
    chunk by chunk in the forward pass (backward only scales them)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, chunked: Callable[..., ChunkedResult],
                arguments: dict) -> tuple[Tensor, Tensor, Tensor]:
        loss, nll, n_tokens, grad_hidden, grad_weight = chunked(hidden, weight, with_grads=True, **arguments)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll, n_tokens)
        return loss, nll, n_tokens

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor, _grad_n: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_loss.to(grad_hidden.dtype), (grad_weight * grad_loss).to(ctx.weight_dtype),
                None, None)


def projected_loss(chunked: Callable[..., ChunkedResult], hidden: Tensor, weight: Tensor, **arguments) -> LossOutput:
    """``chunked(hidden, weight, with_grads=..., **arguments)`` as a loss: one autograd node where a
    gradient is wanted, the sums alone under ``no_grad`` (validation)."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LossOutput(*_ProjectedLoss.apply(hidden, weight, chunked, arguments))
    loss, nll, count, _, _ = chunked(hidden, weight, with_grads=False, **arguments)
    return LossOutput(loss, nll, count)


def projected_label_smoothed_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int,
                                           epsilon: float = 0.1, n_tokens: int | None = None) -> LossOutput:
    """The pre-softmax projection (§3.4) and the label-smoothed cross-entropy (§5.4) of
    ``label_smoothed_cross_entropy``, fused: the same sums without the (tokens x V) logits.

    Training a small model on CPU, the unfused loss spends more time moving its float32
    (tokens x V) logits through memory (the bf16 product's result upcast, the log-softmax, its
    gradient, the gradient cast back) than in the projection's products: 140 ms against 51 ms a
    batch of 1900 target positions at V 8000 on 2 AMD EPYC cores with AVX512-BF16. Here the logits
    are made ``CHUNK_ELEMENTS`` at a time, padding rows skipped, and each chunk's gradient is taken
    through the projection while it is still in cache. The arithmetic is the unfused loss's: the
    product in the autocast dtype (or the weight's), the log-softmax in float32, the gradient cast
    back to the product's dtype; only the order of the sums differs. Under fp16 autocast the
    gradients would be made before the loss scaler scales them (small probabilities would flush to
    zero), so fp16 takes the unfused path.

    Args:
        hidden: (B, T, D) decoder output states (``Transformer.forward(..., project=False)``);
        weight: (V, D) the output projection's weight; target: (B, T) ids, ``pad_id`` positions ignored;
        n_tokens: the count of non-pad targets where the caller knows it (``Batch.n_target_tokens``):
            on a GPU the padding rows are then dropped without reading anything back from the device.
    Returns:
        float32 sums (loss, nll) and the count of non-pad target tokens, as ``label_smoothed_cross_entropy``.
    """
    dtype = compute_dtype(weight)
    if dtype == torch.float16:
        return label_smoothed_cross_entropy(F.linear(hidden, weight), target, pad_id, epsilon)
    return projected_loss(_chunked_loss, hidden, weight, target=target, pad_id=pad_id, epsilon=epsilon, dtype=dtype,
                          n_tokens=n_tokens)
