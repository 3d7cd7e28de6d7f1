"""transformer/loss.py: label-smoothed cross-entropy (§5.4) against a hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.loss import label_smoothed_cross_entropy

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
