"""transformer/training/regularizers.py and the optimizer's decoupled weight decay: the numbers each
computes, checked against the definitions written out, and what a Trainer keeps of them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.tokens import EOS_ID, PAD_ID, UNK_ID
from transformer.training.loss import CHUNK_ELEMENTS, label_smoothed_cross_entropy
from transformer.training.regularizers import drop_source_pieces, projected_rdrop_loss, rdrop_loss
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


def rdrop_case(seed: int = 3, rows: int = 5, width: int = 9, d: int = 16, vocab: int = 40, scale: float = 1.0):
    """Two passes' decoder states (the second a perturbed first, as dropout makes it), a weight, and
    targets with padding at the ends of some rows."""
    torch.manual_seed(seed)
    first = torch.randn(rows, width, d)
    hidden = torch.cat([first, first + 0.5 * torch.randn(rows, width, d)])
    weight = scale * torch.randn(vocab, d) / d**0.5
    target = torch.randint(4, vocab, (rows, width))
    target[1, 6:] = PAD_ID
    target[3, 2:] = PAD_ID
    return hidden, weight, target


def both_rdrop_losses(hidden, weight, target, alpha=5.0, autocast_dtype=None, **fused_kwargs):
    """(loss output, hidden grad, weight grad) of ``rdrop_loss`` and of the fused one, the loss scaled by 0.5."""
    results = []
    for loss_of in (rdrop_loss, projected_rdrop_loss):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        kwargs = fused_kwargs if loss_of is projected_rdrop_loss else {}
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            out = loss_of(h, w, target, PAD_ID, 0.1, alpha, **kwargs)
        (0.5 * out.loss).backward()
        results.append((out, h.grad, w.grad))
    return results


@pytest.mark.parametrize("chunk_elements", [2 * 40 * 3, 2 * 40 * 7, 1 << 21])   # 3 and 7 rows a chunk, and one
@pytest.mark.parametrize("alpha", [0.0, 5.0])
def test_projected_rdrop_loss_equals_the_unfused_loss_in_float32(monkeypatch, chunk_elements, alpha):
    """The same sums and gradients (the KL's written out by hand in the fused loss) as the
    projection followed by ``rdrop_loss``, whatever the chunking (row counts that do not divide the
    real rows), and those of the definitions in float64."""
    monkeypatch.setitem(CHUNK_ELEMENTS, "cpu", chunk_elements)
    hidden, weight, target = rdrop_case()
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_rdrop_losses(hidden, weight, target, alpha)
    real = int((target != PAD_ID).sum())
    assert int(fused.n_tokens) == int(plain.n_tokens) == real == 45 - 3 - 7
    loss, nll = written_out(hidden, weight, target, 0.1, alpha)
    assert fused.loss.item() == pytest.approx(float(loss), rel=1e-6)
    assert fused.nll.item() == pytest.approx(float(nll), rel=1e-6)
    assert fused.loss.requires_grad and not fused.nll.requires_grad
    assert h_fused.dtype == w_fused.dtype == torch.float32
    assert torch.allclose(h_fused, h_plain, rtol=1e-5, atol=1e-6)
    assert torch.allclose(w_fused, w_plain, rtol=1e-5, atol=1e-6)
    assert float(h_fused[3, 2:].abs().max()) == float(h_fused[5 + 3, 2:].abs().max()) == 0.0   # none at pads
    if alpha:   # the KL moves both passes: neither gradient is its cross-entropy's alone
        (_, h_ce, _), _ = both_rdrop_losses(hidden, weight, target, 0.0)
        assert float((h_fused - h_ce)[:5].abs().max()) > 1e-3 and float((h_fused - h_ce)[5:].abs().max()) > 1e-3


def test_projected_rdrop_loss_with_the_gpu_row_order_and_extreme_logits():
    """The rows by their count (``n_tokens``: the GPU's path) and log-probabilities far below -87
    (the clamped exponent): the same loss and gradients."""
    hidden, weight, target = rdrop_case(d=32, vocab=200, scale=60.0)
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_rdrop_losses(
        hidden, weight, target, n_tokens=int((target != PAD_ID).sum()))
    assert float(F.log_softmax(F.linear(hidden, weight), -1).min()) < -200
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-5)
    assert torch.allclose(h_fused, h_plain, rtol=1e-4, atol=1e-4 * float(h_plain.abs().max()))
    assert torch.allclose(w_fused, w_plain, rtol=1e-4, atol=1e-4 * float(w_plain.abs().max()))


def test_projected_rdrop_loss_under_bf16_autocast_is_the_unfused_arithmetic():
    """bf16 products, float32 log-softmax and KL in both: the loss to float32 rounding, the gradients
    to bf16's (each a bf16 product in both paths)."""
    hidden, weight, target = rdrop_case(d=64, vocab=300)
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_rdrop_losses(hidden, weight, target,
                                                                             autocast_dtype=torch.bfloat16)
    assert fused.loss.dtype == fused.nll.dtype == torch.float32
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-5)
    assert fused.nll.item() == pytest.approx(plain.nll.item(), rel=1e-5)
    for ours, theirs in ((h_fused, h_plain), (w_fused, w_plain)):
        assert float((ours - theirs).abs().max()) <= 2e-2 * float(theirs.abs().max())


def test_projected_rdrop_loss_without_gradients_and_of_only_padding():
    hidden, weight, target = rdrop_case()
    with torch.no_grad():
        out = projected_rdrop_loss(hidden, weight.clone().requires_grad_(), target, PAD_ID, 0.1, 5.0)
    assert out.loss.grad_fn is None and not out.loss.requires_grad
    assert out.loss.item() == pytest.approx(rdrop_loss(hidden, weight, target, PAD_ID, 0.1, 5.0).loss.item(), rel=1e-6)
    h = hidden.clone().requires_grad_()
    empty = projected_rdrop_loss(h, weight, torch.full_like(target, PAD_ID), PAD_ID, 0.1, 5.0)
    empty.loss.backward()
    assert empty.loss.item() == 0.0 and int(empty.n_tokens) == 0 and float(h.grad.abs().max()) == 0.0


def test_projected_rdrop_loss_under_fp16_autocast_takes_the_unfused_path():
    """fp16's loss scaler must scale the gradients before a product flushes them: the same bits as unfused."""
    hidden, weight, target = rdrop_case()
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_rdrop_losses(hidden, weight, target,
                                                                             autocast_dtype=torch.float16)
    assert torch.equal(fused.loss, plain.loss) and torch.equal(h_fused, h_plain) and torch.equal(w_fused, w_plain)


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
