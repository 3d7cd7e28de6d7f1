"""transformer/layers.py: feed-forward network (eq. 2), residual + LayerNorm, encoder/decoder layers."""

import pytest
import torch
import torch.nn.functional as F

from transformer.attention import KVCache
from transformer.config import build_config
from transformer.layers import ACTIVATIONS, DecoderLayer, EncoderLayer, FeedForward, Residual

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def test_activation_table_is_the_paper_s_relu_and_gelu():
    assert ACTIVATIONS == {"relu": F.relu, "gelu": F.gelu}
    for name, fn in ACTIVATIONS.items():
        assert FeedForward(build_config("tiny", 10, activation=name)).activation is fn


@pytest.mark.parametrize("activation,fn", [("relu", F.relu), ("gelu", F.gelu)])
def test_feed_forward_is_eq_2(activation, fn):
    ffn = FeedForward(build_config("tiny", 10, activation=activation))
    x = torch.randn(2, 3, 32)
    w1, b1 = ffn.linear1.weight, ffn.linear1.bias
    w2, b2 = ffn.linear2.weight, ffn.linear2.bias
    expected = fn(x @ w1.T + b1) @ w2.T + b2
    assert ffn.linear1.weight.shape == (64, 32)
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_relu_ffn_is_max_zero():
    ffn = FeedForward(build_config("tiny", 10))
    x = torch.randn(4, 32)
    hidden = x @ ffn.linear1.weight.T + ffn.linear1.bias
    expected = torch.maximum(hidden, torch.zeros(())) @ ffn.linear2.weight.T + ffn.linear2.bias
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_post_ln_residual():
    res = Residual(build_config("tiny", 10))
    x, sub = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    assert torch.equal(res.pre(x), x)
    y = res.post(x, sub)
    assert torch.allclose(y, F.layer_norm(x + sub, (32,)), atol=1e-6)
    assert torch.allclose(y.mean(-1), torch.zeros(2, 3), atol=1e-6)


def test_pre_ln_residual():
    res = Residual(build_config("tiny", 10, norm_first=True))
    x, sub = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    assert torch.allclose(res.pre(x), F.layer_norm(x, (32,)), atol=1e-6)
    assert torch.equal(res.post(x, sub), x + sub)


def test_residual_dropout():
    res = Residual(build_config("tiny", 10, dropout=0.5, norm_first=True))
    x, sub = torch.zeros(1000), torch.ones(1000)
    res.train()
    y = res.post(x, sub)
    assert set(y.unique().tolist()) == {0.0, 2.0}  # inverted dropout scales kept values by 1/(1-p)
    res.eval()
    assert torch.equal(res.post(x, sub), sub)


def test_encoder_layer_ignores_masked_keys():
    layer = EncoderLayer(build_config("tiny", 10)).eval()
    x = torch.randn(1, 5, 32)
    mask = torch.tensor([True, True, True, False, False])[None, None, None]
    out = layer(x, mask)
    assert out.shape == (1, 5, 32)
    changed = x.clone()
    changed[:, 3:] = torch.randn(1, 2, 32) * 10
    out2 = layer(changed, mask)
    assert float((out[:, :3] - out2[:, :3]).abs().max()) < 1e-5
    weights = []
    layer(x, mask, weights)
    assert weights[0].shape == (1, 4, 5, 5)
    assert float(weights[0][..., 3:].abs().max()) == 0.0


def test_decoder_layer_is_causal_and_cache_matches():
    layer = DecoderLayer(build_config("tiny", 10)).eval()
    x, memory = torch.randn(2, 4, 32), torch.randn(2, 6, 32)
    src_mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    full = layer(x, memory, src_mask)
    changed = x.clone()
    changed[:, 3] += 5.0
    out2 = layer(changed, memory, src_mask)
    assert float((full[:, :3] - out2[:, :3]).abs().max()) < 1e-6
    assert float((full[:, 3] - out2[:, 3]).abs().max()) > 1e-3
    self_cache, cross_cache = KVCache(), KVCache()
    parts = [layer(x[:, :1], memory, src_mask, self_cache=self_cache, cross_cache=cross_cache),
             layer(x[:, 1:4], memory, src_mask, self_cache=self_cache, cross_cache=cross_cache)]
    assert float((torch.cat(parts, 1) - full).abs().max()) < 1e-5
    assert self_cache.length == 4 and cross_cache.length == 6
