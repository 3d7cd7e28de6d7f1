"""transformer/attention.py on CUDA: PyTorch's fused kernel (``F.scaled_dot_product_attention``, taken
on GPUs when no attention weights are asked for) equals the explicit softmax(QK^T / sqrt(d_k)) V of
§3.2.1, outputs and gradients, in float32 and bfloat16, with padding masks, causal masks (the
training decoder's, and the bottom-right one of a cached multi-token step) and a fully padded row.

The explicit path is selected by asking for the weights: ``return_weights=True`` for the function,
``weights=AttentionWeights()`` for the whole model.
"""

import pytest
import torch

from tests.gpu import requires_cuda
from tests.transformer.conftest import pad_batch, tiny_model
from transformer.attention import scaled_dot_product_attention
from transformer.model import AttentionWeights
from transformer.precision import autocast
from transformer.tokens import BOS_ID, PAD_ID
from transformer.training.loss import label_smoothed_cross_entropy

pytestmark = [requires_cuda, pytest.mark.fast]
CUDA = torch.device("cuda")
B, H, D_HEAD = 3, 4, 16


def run(q, k, v, mask, is_causal, fused, rows):
    """Output and (q, k, v) gradients of one path, the loss taken over batch ``rows`` only."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, return_weights=not fused)
    assert (weights is None) == fused  # the path asked for is the path taken
    g = torch.Generator(device="cuda").manual_seed(1)
    grad_out = torch.randn(out.shape, device=CUDA, generator=g).to(out.dtype)
    (out[rows].float() * grad_out[rows].float()).sum().backward()
    return [t[rows].detach().float() for t in (out, q.grad, k.grad, v.grad)]


def case(name):
    """(T, S, mask, is_causal, rows compared) of each masking case."""
    def lengths_mask(lengths, s):
        return (torch.arange(s, device=CUDA)[None, :] < torch.tensor(lengths, device=CUDA)[:, None])[:, None, None, :]
    if name == "padding":            # encoder / cross-attention: (B, 1, 1, S), real keys first
        return 9, 11, lengths_mask([11, 6, 3], 11), False, [0, 1, 2]
    if name == "causal":             # training decoder self-attention
        return 9, 9, None, True, [0, 1, 2]
    if name == "cached-causal":      # 3 new positions on 8 cached ones: causal, bottom-right aligned
        return 3, 11, torch.ones(3, 11, dtype=torch.bool, device=CUDA).tril(diagonal=8), False, [0, 1, 2]
    # Row 1 has no real key: the explicit softmax over -inf only is NaN there, so rows 0 and 2 are
    # compared, which also shows that the padded row leaks into no other row, forward or backward.
    return 9, 11, lengths_mask([11, 0, 4], 11), False, [0, 2]


@pytest.mark.parametrize("name", ["padding", "causal", "cached-causal", "fully-padded-row"])
def test_fused_equals_explicit_in_float32(name):
    t, s, mask, is_causal, rows = case(name)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D_HEAD, device=CUDA, generator=g) for n in (t, s, s))
    fused = run(q, k, v, mask, is_causal, True, rows)
    explicit = run(q, k, v, mask, is_causal, False, rows)
    for what, a, b in zip(("output", "dq", "dk", "dv"), fused, explicit):
        assert torch.isfinite(a).all(), what
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=lambda m, what=what: f"{name} {what}: {m}")


@pytest.mark.parametrize("name", ["padding", "causal", "cached-causal", "fully-padded-row"])
def test_fused_is_as_accurate_as_explicit_in_bfloat16(name):
    """On bf16 inputs both paths are compared with the float32 computation from the same inputs:
    the fused kernel's error is at most twice the explicit path's (FlashAttention's own criterion;
    the explicit path rounds the scores to bf16, the kernels keep them in float32) and small."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    t, s, mask, is_causal, rows = case(name)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D_HEAD, device=CUDA, generator=g).bfloat16() for n in (t, s, s))
    reference = run(q.float(), k.float(), v.float(), mask, is_causal, False, rows)
    fused = run(q, k, v, mask, is_causal, True, rows)
    explicit = run(q, k, v, mask, is_causal, False, rows)
    for what, f, e, r in zip(("output", "dq", "dk", "dv"), fused, explicit, reference):
        fused_err, explicit_err = float((f - r).abs().max()), float((e - r).abs().max())
        assert fused_err <= 2 * explicit_err + 1e-3, (name, what, fused_err, explicit_err)
        assert fused_err < 0.05 * max(float(r.abs().max()), 1.0), (name, what, fused_err)


def model_outputs(model, src, tgt, precision, explicit):
    """Logits and parameter gradients of the label-smoothed loss (§5.4) through one attention path."""
    model.zero_grad(set_to_none=True)
    with autocast(precision, CUDA):
        logits = model(src, tgt[:, :-1], weights=AttentionWeights() if explicit else None)
    label_smoothed_cross_entropy(logits, tgt[:, 1:], PAD_ID).loss.backward()
    return logits.detach().float(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_model_fused_equals_explicit(precision):
    """The whole encoder-decoder (every attention of Figure 1), forward and backward, on a padded batch."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    model = tiny_model(vocab_size=24).to(CUDA)
    src = pad_batch([[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]).to(CUDA)
    tgt = pad_batch([[BOS_ID, 5, 6, 7, 8], [BOS_ID, 9], [BOS_ID, 10, 11, 12, 13, 14, 15]]).to(CUDA)
    ref_logits, ref_grads = model_outputs(model, src, tgt, "fp32", explicit=True)
    fused_logits, fused_grads = model_outputs(model, src, tgt, precision, explicit=False)
    explicit_logits, explicit_grads = model_outputs(model, src, tgt, precision, explicit=True)
    if precision == "fp32":
        torch.testing.assert_close(fused_logits, ref_logits, rtol=1e-4, atol=1e-5)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-3, atol=1e-6,
                                       msg=lambda m, name=name: f"{name}: {m}")
        return
    assert relative_error(fused_logits, ref_logits) <= 2 * relative_error(explicit_logits, ref_logits) + 1e-3
    for name, grad in ref_grads.items():
        fused_err, explicit_err = relative_error(fused_grads[name], grad), relative_error(explicit_grads[name], grad)
        assert fused_err <= 2 * explicit_err + 1e-3 and fused_err < 0.05, (name, fused_err, explicit_err)
