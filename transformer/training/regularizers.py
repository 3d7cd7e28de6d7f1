"""Regularizers beyond the paper's dropout and label smoothing (§5.4), for small data sets such as
Multi30k, where the published baselines regularize harder than WMT needs: source word dropout and
R-Drop. Both are off by default (``TrainConfig.src_word_dropout``, ``TrainConfig.rdrop_alpha``); the
decoupled weight decay is the optimizer's (``schedule.make_optimizer``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..tokens import UNK_ID
from .loss import (
    CHUNK_ELEMENTS,
    ChunkedResult,
    LossOutput,
    compute_dtype,
    minus_smoothed_target_,
    projected_loss,
    row_count,
    spread_rows,
    target_rows,
)


def drop_source_pieces(src: Tensor, probability: float, pad_id: int, eos_id: int, unk_id: int = UNK_ID) -> Tensor:
    """Word dropout on the source (Bowman et al. 2016; Sennrich et al. 2016 drop whole source words
    in NMT): each piece replaced by ``unk_id`` with ``probability``, padding and the end of sentence
    kept. Draws from the default generator of ``src``'s device, whose state checkpoints keep, so a
    resumed training drops what the uninterrupted one would have. ``probability`` 0: ``src`` itself.
    """
    if probability <= 0.0:
        return src
    drop = torch.rand(src.shape, device=src.device) < probability
    drop &= src.ne(pad_id) & src.ne(eos_id)
    return src.masked_fill(drop, unk_id)


def rdrop_loss(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, epsilon: float,
               alpha: float) -> LossOutput:
    """R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): the batch went
    through the model twice in one forward (``hidden``: its rows, then the same rows again, each pass
    with its own dropout masks); the loss is both passes' label-smoothed cross-entropy (§5.4) plus
    ``alpha`` times the symmetric KL divergence between their output distributions, each token's
    ``(KL(p1 || p2) + KL(p2 || p1)) / 2``, gradients through both sides, as the authors' fairseq
    criterion (``label_smoothed_cross_entropy_with_rdrop``) computes it. That criterion divides its sum
    by one pass's tokens; the sum is halved here, so that the logged loss reads per token as without
    R-Drop. ``alpha`` weighs the KL against the cross-entropy as in the paper (5 for their WMT14
    En-De Transformers); the gradient is half of theirs, which Adam's normalisation undoes (its eps
    and ``clip_norm`` aside).

    Args:
        hidden: (2B, T, D) decoder states (``Transformer.forward(..., project=False)``) of the batch
            twice; weight: (V, D) the output projection's weight; target: (B, T) ids, ``pad_id`` ignored.
    Returns:
        float32 sums over one pass's non-pad tokens: the loss above, the two passes' mean NLL, the count.
    """
    rows = target.size(0)
    logits = F.linear(hidden, weight)   # the autocast dtype, as the fused loss makes its products
    lprobs = F.log_softmax(logits.float(), dim=-1)
    first, second = lprobs[:rows], lprobs[rows:]
    real = target.ne(pad_id)
    # Masks, not boolean indexing: indexing by a mask reads its count back from a GPU.
    picked = target.unsqueeze(-1)
    nll = -(first.gather(-1, picked) + second.gather(-1, picked)).squeeze(-1).masked_fill(~real, 0.0).sum()
    smooth = -(first.sum(-1) + second.sum(-1)).masked_fill(~real, 0.0).sum()
    cross_entropy = (1.0 - epsilon) * nll + (epsilon / lprobs.size(-1)) * smooth
    kl = (F.kl_div(first, second, log_target=True, reduction="none")
          + F.kl_div(second, first, log_target=True, reduction="none")).sum(-1).masked_fill(~real, 0.0).sum() / 2
    return LossOutput((cross_entropy + alpha * kl) / 2, nll.detach() / 2, real.sum())


def _chunked_rdrop(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, epsilon: float, alpha: float,
                   dtype: torch.dtype, with_grads: bool, n_tokens: int | None = None) -> ChunkedResult:
    """``rdrop_loss``'s sums and their gradients, made as ``loss._chunked_loss`` makes the
    cross-entropy's: both passes' logits of a chunk of target rows at a time (``dtype`` products,
    float32 log-softmax), padding skipped, each chunk's gradient taken back through the projection
    while in cache. With d = log p1 - log p2, the symmetric KL of a token is S = sum((p1 - p2) d),
    and dS/dz1 = p1 (d - E_p1[d]) + p1 - p2, dS/dz2 = -p2 (d - E_p2[d]) + p2 - p1 (z: the logits);
    the cross-entropy's is p - the smoothed target, as without R-Drop."""
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    flat_target = target.reshape(-1)
    half = flat_target.numel()
    rows = target_rows(flat_target, pad_id, n_tokens)
    first = flat_hidden[:half].index_select(0, rows).to(dtype)
    second = flat_hidden[half:].index_select(0, rows).to(dtype)
    targets = flat_target.index_select(0, rows)
    w = weight.to(dtype)
    vocab = w.size(0)
    # Two passes' logits a chunk: half the rows of the plain loss's chunk, the same bytes in cache.
    chunk = max(1, CHUNK_ELEMENTS.get(weight.device.type, CHUNK_ELEMENTS["cuda"]) // (2 * vocab))
    cross_entropy = torch.zeros((), dtype=torch.float32, device=weight.device)
    nll = torch.zeros((), dtype=torch.float32, device=weight.device)
    kl = torch.zeros((), dtype=torch.float32, device=weight.device)
    grad_states = torch.empty((2 * rows.numel(), w.size(1)), dtype=dtype, device=weight.device) if with_grads else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
    n_rows = rows.numel()
    for start in range(0, n_rows, chunk):
        h1, h2 = first[start:start + chunk], second[start:start + chunk]
        y = targets[start:start + chunk, None]
        lp1 = F.log_softmax((h1 @ w.t()).float(), dim=-1)
        lp2 = F.log_softmax((h2 @ w.t()).float(), dim=-1)
        nll_rows = -(lp1.gather(1, y) + lp2.gather(1, y))
        nll += nll_rows.sum()
        cross_entropy += (1.0 - epsilon) * nll_rows.sum() - (epsilon / vocab) * (lp1.sum() + lp2.sum())
        # Clamped before exp as in the plain loss (its slow path below about -87); e^-80 is 1.8e-35.
        p1, p2 = lp1.clamp(min=-80.0).exp(), lp2.clamp(min=-80.0).exp()
        d = lp1.sub_(lp2)   # lp1 and lp2 are not read again
        e1, e2 = (p1 * d).sum(-1, keepdim=True), (p2 * d).sum(-1, keepdim=True)   # E_p1[d], E_p2[d]
        kl += (e1 - e2).sum()   # sum((p1 - p2) d)
        if with_grads:
            p_diff = p1 - p2
            g1 = (d - e1).mul_(p1).add_(p_diff).mul_(alpha / 2)
            g2 = (d - e2).mul_(p2).add_(p_diff).mul_(-alpha / 2)
            # Plus the cross-entropy's, as without R-Drop.
            g1 = minus_smoothed_target_(g1.add_(p1), y, epsilon).to(dtype)
            g2 = minus_smoothed_target_(g2.add_(p2), y, epsilon).to(dtype)
            end = start + h1.size(0)
            grad_states[start:end] = g1 @ w
            grad_states[n_rows + start:n_rows + end] = g2 @ w
            grad_weight += (g1.t() @ h1).float() + (g2.t() @ h2).float()
    grad_hidden = None
    if with_grads:   # halved, as the sums below
        grad_hidden = spread_rows(grad_states, torch.cat([rows, rows + half]), hidden).mul_(0.5)
        grad_weight.mul_(0.5)
    return (cross_entropy + alpha * kl / 2) / 2, nll / 2, row_count(rows), grad_hidden, grad_weight


def projected_rdrop_loss(hidden: Tensor, weight: Tensor, target: Tensor, pad_id: int, epsilon: float, alpha: float,
                         n_tokens: int | None = None) -> LossOutput:
    """``rdrop_loss`` fused with the output projection (§3.4), as
    ``loss.projected_label_smoothed_cross_entropy`` is with the plain loss: the same sums and
    gradients without the two passes' (tokens x V) logits, their log-softmaxes and the KL's terms
    in memory: with ``rdrop_loss`` an R-Drop update cost 3.54 plain ones on a CPU core (AVX512-BF16,
    the default model), with this one 1.90 (docs/log/benchmarks.md). fp16 takes ``rdrop_loss`` (its
    loss scaler must scale the gradients first).

    Args:
        hidden: (2B, T, D) decoder states of the batch twice; weight: (V, D) the output projection's weight;
        target: (B, T) ids, ``pad_id`` ignored; n_tokens: the count of non-pad targets where the caller
            knows it (no read-back from a GPU).
    """
    dtype = compute_dtype(weight)
    if dtype == torch.float16:
        return rdrop_loss(hidden, weight, target, pad_id, epsilon, alpha)
    return projected_loss(_chunked_rdrop, hidden, weight, target=target, pad_id=pad_id, epsilon=epsilon, alpha=alpha,
                          dtype=dtype, n_tokens=n_tokens)
