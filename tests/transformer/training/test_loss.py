"""transformer/training/loss.py: label-smoothed cross-entropy (§5.4) against a hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.training.loss import (
    CHUNK_ELEMENTS,
    label_smoothed_cross_entropy,
    projected_label_smoothed_cross_entropy,
    unpadded_rows,
)

pytestmark = pytest.mark.fast

PAD = 0
# B=1, T=3, V=4; the last position is padding.
LOGITS = [[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0], [9.0, -9.0, 4.0, 1.0]]]
TARGET = [[1, 2, PAD]]


def hand_loss(logits, target, eps, pad):
    """sum over non-pad positions of (1 - eps) * (-log p_y) + eps * mean_v(-log p_v), in Python floats."""
    loss = nll = 0.0
    n = 0
    for row, y in zip(logits, target):
        if y == pad:
            continue
        log_z = math.log(sum(math.exp(z) for z in row))
        neg_log_p = [log_z - z for z in row]
        nll += neg_log_p[y]
        loss += (1 - eps) * neg_log_p[y] + eps * sum(neg_log_p) / len(row)
        n += 1
    return loss, nll, n


def test_equals_hand_computation():
    logits, target = torch.tensor(LOGITS), torch.tensor(TARGET)
    out = label_smoothed_cross_entropy(logits, target, PAD, epsilon=0.1)
    loss, nll, n = hand_loss(LOGITS[0], TARGET[0], 0.1, PAD)
    assert int(out.n_tokens) == n == 2
    assert out.loss.item() == pytest.approx(loss, abs=1e-5)
    assert out.nll.item() == pytest.approx(nll, abs=1e-5)
    # The numbers themselves: -log p_1 at position 0 = 1.4401897, -log p_2 at position 1 = 0.1938853.
    assert nll == pytest.approx(1.4401897 + 0.1938853, abs=1e-6)
    assert out.loss.dtype == torch.float32 and out.loss.dim() == 0


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_hand_computation_random(eps):
    logits = torch.randn(3, 5, 7)
    target = torch.randint(1, 7, (3, 5))
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    out = label_smoothed_cross_entropy(logits, target, PAD, epsilon=eps)
    loss = nll = 0.0
    n = 0
    for b in range(3):
        lo, nl, k = hand_loss(logits[b].tolist(), target[b].tolist(), eps, PAD)
        loss, nll, n = loss + lo, nll + nl, n + k
    assert int(out.n_tokens) == n == 15 - 2 - 4
    assert out.loss.item() == pytest.approx(loss, abs=1e-4)
    assert out.nll.item() == pytest.approx(nll, abs=1e-4)
    if eps == 0.0:
        assert out.loss.item() == pytest.approx(out.nll.item(), abs=1e-5)


def test_padding_positions_are_ignored():
    logits, target = torch.tensor(LOGITS), torch.tensor(TARGET)
    out = label_smoothed_cross_entropy(logits, target, PAD)
    changed = logits.clone()
    changed[0, 2] = torch.tensor([-50.0, 50.0, 0.0, 7.0])  # the pad position
    again = label_smoothed_cross_entropy(changed, target, PAD)
    assert torch.equal(out.loss, again.loss) and torch.equal(out.nll, again.nll)
    # Equivalent to dropping the pad position.
    dropped = label_smoothed_cross_entropy(logits[:, :2], target[:, :2], PAD)
    assert dropped.loss.item() == pytest.approx(out.loss.item(), abs=1e-6)


def test_nll_equals_cross_entropy():
    logits = torch.randn(4, 6, 11)
    target = torch.randint(0, 11, (4, 6))
    out = label_smoothed_cross_entropy(logits, target, PAD, epsilon=0.1)
    expected = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum")
    assert out.nll.item() == pytest.approx(expected.item(), rel=1e-6)
    assert int(out.n_tokens) == int((target != PAD).sum())


def test_gradient_flows_through_loss_not_nll():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    target = torch.tensor([[1, 2, 3], [4, PAD, PAD]])
    out = label_smoothed_cross_entropy(logits, target, PAD)
    assert out.loss.requires_grad and not out.nll.requires_grad
    out.loss.backward()
    assert float(logits.grad[1, 1:].abs().max()) == 0.0  # no gradient at pads
    # d loss / d logits = softmax - ((1 - eps) one_hot + eps / V) at each real position.
    p = torch.softmax(logits.detach()[0, 0], -1)
    smoothed = torch.full((5,), 0.1 / 5)
    smoothed[1] += 0.9
    assert torch.allclose(logits.grad[0, 0], p - smoothed, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_arithmetic_as_pytorch_cross_entropy_in_float32(dtype):
    """One float32 log-softmax gives both losses, bit for bit what ``F.cross_entropy`` gives on the
    float32 logits with and without ``label_smoothing``, gradient included (bf16: the training's
    autocast dtype, whose gradient comes back in bf16 through the same upcast)."""
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 7, 50)).to(dtype).requires_grad_()
    target = torch.randint(1, 50, (3, 7))
    target[:, 5:] = PAD
    out = label_smoothed_cross_entropy(logits, target, PAD, epsilon=0.1)
    assert out.loss.dtype == out.nll.dtype == torch.float32
    out.loss.backward()
    ours_grad, logits.grad = logits.grad, None
    flat, flat_target = logits.flatten(0, 1).float(), target.reshape(-1)
    expected = F.cross_entropy(flat, flat_target, ignore_index=PAD, reduction="sum", label_smoothing=0.1)
    expected.backward()
    expected_nll = F.cross_entropy(flat.detach(), flat_target, ignore_index=PAD, reduction="sum")
    assert torch.equal(out.loss, expected) and torch.equal(out.nll, expected_nll)
    assert ours_grad.dtype == dtype and torch.equal(ours_grad, logits.grad)


def float64_losses(logits, target, eps):
    """(loss, nll) summed over non-pad positions, in float64 from the given logits."""
    lprobs = torch.log_softmax(logits.double().flatten(0, 1), dim=-1)
    flat = target.reshape(-1)
    real = flat != PAD
    nll = -lprobs[real].gather(1, flat[real, None]).sum()
    return float((1 - eps) * nll - eps * lprobs[real].mean(-1).sum()), float(nll)


def test_loss_of_bf16_autocast_logits_is_computed_in_float32():
    """Under bf16 autocast the model's logits are bf16; the loss and NLL computed from them are the
    float32 figures of those same logits (~1e-7 relative), not those of a bf16 log-softmax, which is
    off by ~1e-3 relative (what the reported NLL, perplexity and validation loss were before)."""
    from transformer.config import build_config
    from transformer.model import Transformer

    model = Transformer(build_config("tiny", 500)).eval()
    src = torch.randint(4, 500, (8, 12))
    tgt = torch.randint(4, 500, (8, 10))
    tgt[:3, 7:] = PAD
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
        out = label_smoothed_cross_entropy(logits, tgt, PAD, epsilon=0.1)
    assert logits.dtype == torch.bfloat16 and out.loss.dtype == out.nll.dtype == torch.float32
    loss, nll = float64_losses(logits, tgt, 0.1)
    assert out.nll.item() == pytest.approx(nll, rel=1e-6)
    assert out.loss.item() == pytest.approx(loss, rel=1e-6)
    plain = label_smoothed_cross_entropy(logits.float(), tgt, PAD, epsilon=0.1)  # fp32 on the same logits
    assert out.nll.item() == pytest.approx(plain.nll.item(), rel=1e-6)
    in_bf16 = F.cross_entropy(logits.flatten(0, 1), tgt.reshape(-1), ignore_index=PAD, reduction="sum")
    assert in_bf16.dtype == torch.bfloat16
    assert abs(in_bf16.item() - nll) / nll > 1e-4  # the test would see a bf16 computation


# --- the projection fused into the loss (training's path) -------------------------------------

def projected_case(seed=0, batch=5, width=9, d=16, vocab=40, scale=1.0):
    """Decoder states, a weight and targets with padding at the ends of some rows."""
    torch.manual_seed(seed)
    hidden = torch.randn(batch, width, d)
    weight = scale * torch.randn(vocab, d) / d**0.5
    target = torch.randint(1, vocab, (batch, width))
    target[1, 6:] = PAD
    target[3, 2:] = PAD
    return hidden, weight, target


def both_losses(hidden, weight, target, eps=0.1, autocast_dtype=None):
    """(loss output, hidden grad, weight grad) of the unfused and the fused path, loss scaled by 0.5."""
    results = []
    for fused in (False, True):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            if fused:
                out = projected_label_smoothed_cross_entropy(h, w, target, PAD, epsilon=eps)
            else:
                out = label_smoothed_cross_entropy(F.linear(h, w), target, PAD, epsilon=eps)
        (0.5 * out.loss).backward()
        results.append((out, h.grad, w.grad))
    return results


@pytest.mark.parametrize("chunk_elements", [40 * 3, 40 * 7, 1 << 21])  # 3 and 7 rows a chunk, and one chunk
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_projected_loss_equals_the_unfused_loss_in_float32(monkeypatch, chunk_elements, eps):
    """The same sums and gradients as the projection followed by ``label_smoothed_cross_entropy``,
    whatever the chunking (row counts that do not divide the 33 real rows)."""
    monkeypatch.setitem(CHUNK_ELEMENTS, "cpu", chunk_elements)
    hidden, weight, target = projected_case()
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_losses(hidden, weight, target, eps)
    assert int(fused.n_tokens) == int(plain.n_tokens) == 45 - 3 - 7
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6)
    assert fused.nll.item() == pytest.approx(plain.nll.item(), rel=1e-6)
    assert fused.loss.requires_grad and not fused.nll.requires_grad
    assert h_fused.dtype == w_fused.dtype == torch.float32
    assert torch.allclose(h_fused, h_plain, rtol=1e-5, atol=1e-7)
    assert torch.allclose(w_fused, w_plain, rtol=1e-5, atol=1e-7)
    assert float(h_fused[3, 2:].abs().max()) == 0.0  # no gradient at pads


def test_projected_loss_under_bf16_autocast_is_the_unfused_arithmetic():
    """bf16 products, float32 log-softmax, as the unfused path under autocast: the same loss to
    float32 rounding, the gradients to bf16 rounding (each is a bf16 product in both paths)."""
    hidden, weight, target = projected_case(d=64, vocab=300)
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_losses(hidden, weight, target,
                                                                       autocast_dtype=torch.bfloat16)
    assert fused.loss.dtype == fused.nll.dtype == torch.float32
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-5)
    assert fused.nll.item() == pytest.approx(plain.nll.item(), rel=1e-5)
    assert h_fused.dtype == torch.float32
    for ours, theirs in ((h_fused, h_plain), (w_fused, w_plain)):
        assert float((ours - theirs).abs().max()) <= 2e-2 * float(theirs.abs().max())
    # And bf16 it is: a float32 computation would be closer to float64 than bf16 rounding allows.
    _, nll64 = float64_losses(F.linear(hidden, weight), target, 0.1)
    assert abs(fused.nll.item() - nll64) / nll64 > 1e-6


def test_projected_loss_with_extreme_logits():
    """Log-probabilities far below -87 (untrained tied embeddings at a large vocabulary): the
    clamped exponent leaves the loss and the gradients as they are."""
    hidden, weight, target = projected_case(d=32, vocab=200, scale=60.0)
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_losses(hidden, weight, target)
    assert float(F.log_softmax(F.linear(hidden, weight), -1).min()) < -200
    assert fused.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6)
    assert torch.allclose(h_fused, h_plain, rtol=1e-5, atol=1e-6)
    assert torch.allclose(w_fused, w_plain, rtol=1e-5, atol=1e-6)


def test_projected_loss_without_gradients_builds_no_graph():
    """Validation: under no_grad the same sums, nothing kept for a backward pass."""
    hidden, weight, target = projected_case()
    with torch.no_grad():
        out = projected_label_smoothed_cross_entropy(hidden, weight.requires_grad_(), target, PAD)
    plain = label_smoothed_cross_entropy(F.linear(hidden, weight.detach()), target, PAD)
    assert out.loss.grad_fn is None and not out.loss.requires_grad
    assert out.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6)
    assert int(out.n_tokens) == int(plain.n_tokens)


def test_projected_loss_of_only_padding_is_zero():
    hidden, weight, target = projected_case()
    h = hidden.clone().requires_grad_()
    out = projected_label_smoothed_cross_entropy(h, weight, torch.full_like(target, PAD), PAD)
    out.loss.backward()
    assert out.loss.item() == 0.0 and int(out.n_tokens) == 0 and float(h.grad.abs().max()) == 0.0


def test_projected_loss_under_fp16_autocast_takes_the_unfused_path():
    """fp16 trains with a loss scaler, which must scale the gradient before the bf16/fp16 product
    flushes its small values: the fused path is not taken there (the same bits as unfused)."""
    hidden, weight, target = projected_case()
    (plain, h_plain, w_plain), (fused, h_fused, w_fused) = both_losses(hidden, weight, target,
                                                                       autocast_dtype=torch.float16)
    assert torch.equal(fused.loss, plain.loss) and torch.equal(h_fused, h_plain) and torch.equal(w_fused, w_plain)


def test_model_gradients_through_the_fused_loss_equal_the_unfused():
    """The trainer's path (decoder states, the tied output weight, the fused loss) gives every
    parameter the gradient the logits path gives it, the tied embedding's included."""
    from transformer.config import build_config
    from transformer.model import Transformer

    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 300)).eval()
    src = torch.randint(4, 300, (6, 11))
    tgt_in = torch.randint(4, 300, (6, 9))
    tgt_out = torch.randint(4, 300, (6, 9))
    tgt_out[2, 5:] = PAD
    grads = []
    for fused in (False, True):
        model.zero_grad()
        if fused:
            hidden = model(src, tgt_in, project=False)
            assert hidden.shape == (6, 9, model.config.d_model)
            out = projected_label_smoothed_cross_entropy(hidden, model.output.weight, tgt_out, PAD)
        else:
            out = label_smoothed_cross_entropy(model(src, tgt_in), tgt_out, PAD)
        out.loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, plain in grads[0].items():
        assert torch.allclose(grads[1][name], plain, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("seed", range(5))
def test_unpadded_rows_by_their_count_are_nonzeros_rows(seed):
    """The GPU path's rows (a stable sort, given the count the host knows) are nonzero's, in order."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 4, (7, 13), generator=generator)   # about a quarter padding (id 0)
    flat = target.reshape(-1)
    expected = flat.ne(0).nonzero().squeeze(1)
    assert torch.equal(unpadded_rows(flat, 0, expected.numel()), expected)
    assert unpadded_rows(torch.zeros(5, dtype=torch.long), 0, 0).numel() == 0
