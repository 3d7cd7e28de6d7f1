"""transformer/packed.py: oneDNN-packed linear layers for CPU inference give the plain layers'
results (float32 to rounding; the same beam search outputs) and leave training untouched."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.attention import MultiHeadAttention
from transformer.layers import FeedForward
from transformer.packed import PackedLinear, pack_linears, packing_available
from transformer.search import beam_search, greedy_search

from .conftest import pad_batch, tiny_model

pytestmark = [pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN"), pytest.mark.fast]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_packed_linear_equals_f_linear(dtype, tolerance):
    if not packing_available(dtype):
        pytest.skip(f"oneDNN cannot pack {dtype} weights on this CPU")
    torch.manual_seed(0)
    w, b = torch.randn(48, 32, dtype=dtype), torch.randn(48, dtype=dtype)
    layer = PackedLinear(w, b)
    assert (layer.in_features, layer.out_features) == (32, 48)
    for x in (torch.randn(7, 32, dtype=dtype), torch.randn(3, 5, 32, dtype=dtype),
              torch.randn(5, 3, 32, dtype=dtype).transpose(0, 1)):  # 2-D, 3-D, strided
        with torch.inference_mode():
            expected, got = F.linear(x, w, b), layer(x)
        assert got.shape == expected.shape and got.dtype == dtype
        assert float((got.float() - expected.float()).abs().max()) <= tolerance * float(expected.abs().max())
    assert PackedLinear(w, None)(torch.zeros(2, 32, dtype=dtype)).abs().max() == 0


@pytest.mark.parametrize("activation", [F.relu, F.gelu])
def test_packed_linear_fuses_the_activation(activation):
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 32), torch.randn(48), torch.randn(3, 5, 32)
    with torch.inference_mode():
        expected, got = activation(F.linear(x, w, b)), PackedLinear(w, b, activation=activation)(x)
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
    assert (got < 0).any() == (activation is F.gelu)  # ReLU's output is never negative; GELU's can be


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_pack_linears_replaces_every_linear_and_keeps_the_model_s_outputs(activation):
    model = tiny_model(seed=2, activation=activation).eval()
    packed = pack_linears(copy.deepcopy(model))
    feed_forwards = [m for m in packed.modules() if isinstance(m, FeedForward)]
    assert feed_forwards and all(isinstance(m.activation, nn.Identity) and m.linear1.post_op == activation
                                 for m in feed_forwards)
    assert not any(isinstance(m, nn.Linear) and not isinstance(parent, MultiHeadAttention)
                   for parent in packed.modules() for m in parent.children())
    attention = [m for m in packed.modules() if isinstance(m, MultiHeadAttention)]
    assert attention and all(set(m.packed_projections) == {"qkv", "q", "kv"} for m in attention)
    assert all(m.packed_projections is None for m in model.modules() if isinstance(m, MultiHeadAttention))

    src = pad_batch([[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16]])
    tgt = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 10], [2, 11, 12, 13]])
    with torch.inference_mode():
        expected, got = model(src, tgt), packed(src, tgt)
    assert float((got - expected).abs().max()) < 1e-4
    assert beam_search(packed, src, beam_size=3).hypotheses == beam_search(model, src, beam_size=3).hypotheses
    assert greedy_search(packed, src).hypotheses == greedy_search(model, src).hypotheses


def test_pack_linears_leaves_weights_it_cannot_pack():
    """bfloat16 packing needs AVX-512 (or AVX-NE-CONVERT): without it the model stays as it was."""
    model = tiny_model(seed=2).to(torch.bfloat16)
    packed = pack_linears(copy.deepcopy(model))
    linears = [m for m in packed.modules() if isinstance(m, nn.Linear)]
    if packing_available(torch.bfloat16):
        assert not any(isinstance(m, FeedForward) and isinstance(m.linear1, nn.Linear) for m in packed.modules())
    else:
        assert len(linears) == len([m for m in model.modules() if isinstance(m, nn.Linear)])
        src = pad_batch([[5, 6, 7]])
        assert beam_search(packed, src, beam_size=3).hypotheses == beam_search(model, src, beam_size=3).hypotheses
