"""transformer/training/regularizers.py and the optimizer's decoupled weight decay: the numbers each
computes, checked against the definitions written out, and what a Trainer keeps of them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.tokens import EOS_ID, PAD_ID, UNK_ID
from transformer.training.loss import label_smoothed_cross_entropy
from transformer.training.regularizers import drop_source_pieces, rdrop_loss
from transformer.training.schedule import make_optimizer
from transformer.training.train_config import OPTIONAL_FIELDS, TrainConfig, stored_config

pytestmark = pytest.mark.fast


def source(rows: int = 64, width: int = 30) -> torch.Tensor:
    src = torch.randint(4, 100, (rows, width))
    lengths = torch.randint(3, width, (rows,))
    src[torch.arange(width)[None, :] == lengths[:, None]] = EOS_ID
    src[torch.arange(width)[None, :] > lengths[:, None]] = PAD_ID
    return src


# ---------------------------------------------------------------- source word dropout
def test_word_dropout_replaces_pieces_at_its_rate_and_never_padding_or_the_end():
    torch.manual_seed(0)
    src = source()
    dropped = drop_source_pieces(src, 0.2, PAD_ID, EOS_ID)
    pieces = (src != PAD_ID) & (src != EOS_ID)
    changed = dropped != src
    assert torch.equal(dropped[changed], torch.full((int(changed.sum()),), UNK_ID))
    assert not changed[~pieces].any()   # padding and EOS untouched
    assert dropped.shape == src.shape and dropped.dtype == src.dtype
    rate = changed.sum().item() / pieces.sum().item()
    assert abs(rate - 0.2) < 0.03, rate


def test_word_dropout_off_is_the_same_tensor_and_draws_nothing():
    src = source()
    state = torch.get_rng_state()
    assert drop_source_pieces(src, 0.0, PAD_ID, EOS_ID) is src
    assert torch.equal(torch.get_rng_state(), state)


def test_word_dropout_follows_the_generator():
    src = source()
    torch.manual_seed(7)
    first = drop_source_pieces(src, 0.3, PAD_ID, EOS_ID)
    torch.manual_seed(7)
    assert torch.equal(drop_source_pieces(src, 0.3, PAD_ID, EOS_ID), first)


# ---------------------------------------------------------------- R-Drop
def written_out(hidden, weight, target, eps, alpha):
    """R-Drop's loss from the definitions, token by token, in float64."""
    rows = target.size(0)
    lp = F.log_softmax((hidden.double() @ weight.double().t()), dim=-1)
    total, nll_total, vocab = 0.0, 0.0, weight.size(0)
    for b in range(rows):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD_ID:
                continue
            p, q = lp[b, t], lp[rows + b, t]
            for lps in (p, q):
                total += (1 - eps) * -lps[y] + eps / vocab * -lps.sum()
                nll_total += -lps[y]
            kl_pq = (p.exp() * (p - q)).sum()
            kl_qp = (q.exp() * (q - p)).sum()
            total += alpha * (kl_pq + kl_qp) / 2
    return total / 2, nll_total / 2


def test_rdrop_loss_is_both_passes_cross_entropy_and_the_symmetric_kl_halved():
    torch.manual_seed(1)
    target = source(rows=3, width=6)[:, :6]
    hidden = torch.randn(6, 6, 8, requires_grad=True)
    weight = torch.randn(20, 8, requires_grad=True)
    target = target.clamp(max=19)
    out = rdrop_loss(hidden, weight, target, PAD_ID, 0.1, alpha=5.0)
    loss, nll = written_out(hidden.detach(), weight.detach(), target, 0.1, 5.0)
    assert out.loss.item() == pytest.approx(float(loss), rel=1e-5)
    assert out.nll.item() == pytest.approx(float(nll), rel=1e-5)
    assert out.n_tokens.item() == int((target != PAD_ID).sum())
    out.loss.backward()
    assert hidden.grad.abs().sum() > 0 and weight.grad.abs().sum() > 0


def test_rdrop_with_two_equal_passes_is_the_label_smoothed_loss():
    """No dropout difference, no KL: the loss of one pass (the trainer's without R-Drop)."""
    torch.manual_seed(2)
    target = source(rows=4, width=7).clamp(max=29)
    half = torch.randn(4, 7, 16)
    weight = torch.randn(30, 16)
    out = rdrop_loss(torch.cat([half, half]), weight, target, PAD_ID, 0.1, alpha=5.0)
    plain = label_smoothed_cross_entropy(half @ weight.t(), target, PAD_ID, 0.1)
    assert out.loss.item() == pytest.approx(plain.loss.item(), rel=1e-5)
    assert out.nll.item() == pytest.approx(plain.nll.item(), rel=1e-5)


# ---------------------------------------------------------------- decoupled weight decay
def test_weight_decay_is_decoupled_from_the_gradient():
    """AdamW: with a zero gradient a step only shrinks each weight by rate x decay (Adam's coupled
    decay would instead move it by about the rate, its gradient normalised)."""
    weight = torch.nn.Parameter(torch.full((4,), 2.0))
    optimizer = make_optimizer([weight], weight_decay=0.1, fused=False)
    assert isinstance(optimizer, torch.optim.AdamW)
    for group in optimizer.param_groups:
        group["lr"] = 0.01
    weight.grad = torch.zeros(4)
    optimizer.step()
    assert torch.allclose(weight.detach(), torch.full((4,), 2.0 * (1 - 0.01 * 0.1)))
    plain = make_optimizer([torch.nn.Parameter(torch.ones(2))], fused=False)
    assert type(plain) is torch.optim.Adam
    decay = plain.param_groups[0]["weight_decay"]
    assert decay == 0.0 and type(decay) is float   # as before: an int 0 would change a checkpoint's bytes


# ---------------------------------------------------------------- the config and checkpoints
def test_the_new_keys_are_checked_and_kept_only_when_set():
    with pytest.raises(ValueError, match=r"TrainConfig.src_word_dropout must be in \[0, 1\), got 1.0"):
        TrainConfig(max_steps=1, src_word_dropout=1.0)
    with pytest.raises(ValueError, match=r"TrainConfig.rdrop_alpha must be a non-negative number, got -1"):
        TrainConfig(max_steps=1, rdrop_alpha=-1)
    off = stored_config(TrainConfig(max_steps=1))
    assert not set(OPTIONAL_FIELDS) & set(off)   # the checkpoints of before: the same keys, the same bytes
    on = stored_config(TrainConfig(max_steps=1, src_word_dropout=0.1, rdrop_alpha=5.0))
    assert on["src_word_dropout"] == 0.1 and on["rdrop_alpha"] == 5.0
    assert math.isclose(TrainConfig(max_steps=1).rdrop_alpha, 0.0)
    assert "decoupled_weight_decay" not in off   # Adam's coupled L2 before: a checkpoint of then is not resumed
    assert stored_config(TrainConfig(max_steps=1, weight_decay=0.01))["decoupled_weight_decay"] is True
