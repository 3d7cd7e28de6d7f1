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
from .loss import LossOutput


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
