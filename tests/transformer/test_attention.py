"""transformer/attention.py: scaled dot-product attention (eq. 1), multi-head attention, KV cache."""

import math

import numpy as np
import pytest
import torch

from transformer.attention import FUSED_CPU_MAX_ROWS, KVCache, MultiHeadAttention, scaled_dot_product_attention

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


# A hand example: T=2 queries, S=3 keys, d=2.
Q = [[1.0, 0.0], [0.0, 1.0]]
K = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
V = [[1.0, 0.0], [0.0, 1.0], [2.0, 3.0]]


def hand_attention(q, k, v, allowed=None):
    """softmax(q k^T / sqrt(d)) v written out with Python floats; allowed[i][j] False masks key j."""
    d = len(q[0])
    weights, out = [], []
    for i, qi in enumerate(q):
        scores = [sum(a * b for a, b in zip(qi, kj)) / math.sqrt(d) for kj in k]
        exps = [math.exp(s) if (allowed is None or allowed[i][j]) else 0.0 for j, s in enumerate(scores)]
        w = [e / sum(exps) for e in exps]
        weights.append(w)
        out.append([sum(w[j] * v[j][c] for j in range(len(v))) for c in range(len(v[0]))])
    return out, weights


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_hand_example_numbers():
    # e = exp(1/sqrt 2) = 2.0281; row 0 scores (1, 0, 1)/sqrt 2 -> weights (e, 1, e) / (2e + 1).
    e = math.exp(1 / math.sqrt(2))
    out, weights = scaled_dot_product_attention(t(Q), t(K), t(V), return_weights=True)
    np.testing.assert_allclose(weights.numpy(), [[e / (2 * e + 1), 1 / (2 * e + 1), e / (2 * e + 1)],
                                                 [1 / (2 * e + 1), e / (2 * e + 1), e / (2 * e + 1)]], atol=1e-6)
    np.testing.assert_allclose(weights[0].numpy(), [0.4011121, 0.1977758, 0.4011121], atol=1e-6)
    np.testing.assert_allclose(out.numpy(), [[1.2033363, 1.4011121], [1.0, 1.6044484]], atol=1e-6)


@pytest.mark.parametrize("return_weights", [True, False])
def test_equals_hand_computation(return_weights):
    expected_out, expected_w = hand_attention(Q, K, V)
    out, weights = scaled_dot_product_attention(t(Q), t(K), t(V), return_weights=return_weights)
    assert out.shape == (2, 2)
    np.testing.assert_allclose(out.numpy(), expected_out, atol=1e-6)
    if return_weights:
        np.testing.assert_allclose(weights.numpy(), expected_w, atol=1e-6)
        np.testing.assert_allclose(weights.sum(-1).numpy(), [1.0, 1.0], atol=1e-6)
    else:
        assert weights is None


@pytest.mark.parametrize("return_weights", [True, False])
def test_boolean_mask_true_means_allowed(return_weights):
    allowed = [[True, False, True], [False, True, True]]
    expected_out, expected_w = hand_attention(Q, K, V, allowed)
    out, weights = scaled_dot_product_attention(t(Q), t(K), t(V), torch.tensor(allowed),
                                                return_weights=return_weights)
    np.testing.assert_allclose(out.numpy(), expected_out, atol=1e-6)
    # Row 0 attends to keys 0 and 2 with equal scores 1/sqrt 2: the mean of v0 and v2.
    np.testing.assert_allclose(out[0].numpy(), [1.5, 1.5], atol=1e-6)
    if return_weights:
        np.testing.assert_allclose(weights.numpy(), expected_w, atol=1e-6)
        assert weights[0, 1] == 0.0 and weights[1, 0] == 0.0


@pytest.mark.parametrize("return_weights", [True, False])
def test_is_causal(return_weights):
    q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    allowed = [[True, False, False], [True, True, False], [True, True, True]]
    expected_out, expected_w = hand_attention(q, K, V, allowed)
    out, weights = scaled_dot_product_attention(t(q), t(K), t(V), is_causal=True,
                                                return_weights=return_weights)
    np.testing.assert_allclose(out.numpy(), expected_out, atol=1e-6)
    np.testing.assert_allclose(out[0].numpy(), V[0], atol=1e-6)  # the first query sees only key 0
    if return_weights:
        np.testing.assert_allclose(weights.numpy(), expected_w, atol=1e-6)
        assert torch.equal(weights.triu(1), torch.zeros(3, 3))


def test_is_causal_combined_with_mask():
    q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    key_mask = torch.tensor([True, False, True])  # broadcast over queries
    allowed = [[True, False, False], [True, False, False], [True, False, True]]
    expected_out, expected_w = hand_attention(q, K, V, allowed)
    out, weights = scaled_dot_product_attention(t(q), t(K), t(V), key_mask, is_causal=True, return_weights=True)
    np.testing.assert_allclose(out.numpy(), expected_out, atol=1e-6)
    np.testing.assert_allclose(weights.numpy(), expected_w, atol=1e-6)


@pytest.mark.parametrize("rows", [FUSED_CPU_MAX_ROWS // 4, 4 * FUSED_CPU_MAX_ROWS])
@pytest.mark.parametrize("causal", [False, True])
def test_output_without_weights_equals_the_explicit_form(rows, causal):
    """Without weights, a small block (a decoding step's beam: PyTorch's fused kernel on CPU) and a
    large one (the explicit form) give the output of the explicit form with weights, padded keys
    and a fully padded sentence included."""
    torch.manual_seed(0)
    b, h, t = rows // 4, 2, 2   # rows = b * h * t query rows
    q, k, v = torch.randn(b, h, t, 8), torch.randn(b, h, 6, 8), torch.randn(b, h, 6, 8)
    mask = torch.ones(b, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., 4:] = False
    if causal:
        out, _ = scaled_dot_product_attention(q, k[..., :t, :], v[..., :t, :], is_causal=True)
        reference, _ = scaled_dot_product_attention(q, k[..., :t, :], v[..., :t, :], is_causal=True,
                                                    return_weights=True)
    else:
        out, _ = scaled_dot_product_attention(q, k, v, mask)
        reference, _ = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert out.shape == (b, h, t, 8)
    assert float((out - reference).abs().max()) < 1e-6


def test_batched_heads_and_broadcast_mask():
    b, h, tq, s, d = 2, 3, 4, 5, 8
    q, k, v = torch.randn(b, h, tq, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[1, ..., 3:] = False
    out, weights = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    assert out.shape == (b, h, tq, d) and weights.shape == (b, h, tq, s)
    assert float(weights[1, ..., 3:].abs().max()) == 0.0
    # Row by row against numpy.
    qn, kn, vn = q.double().numpy(), k.double().numpy(), v.double().numpy()
    scores = qn @ kn.transpose(0, 1, 3, 2) / math.sqrt(d)
    scores[1, :, :, 3:] = -np.inf
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights.numpy(), w, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), w @ vn, atol=1e-5)


def manual_mha(mha: MultiHeadAttention, x, memory=None, allowed=None):
    """Per-head attention in float64 numpy from the in_proj row blocks and out_proj."""
    d, h = mha.d_model, mha.n_heads
    dh = d // h
    w = mha.in_proj.weight.detach().double().numpy()
    bias = mha.in_proj.bias.detach().double().numpy()
    w_q, w_k, w_v = w[:d], w[d:2 * d], w[2 * d:]
    b_q, b_k, b_v = bias[:d], bias[d:2 * d], bias[2 * d:]
    w_o = mha.out_proj.weight.detach().double().numpy()
    b_o = mha.out_proj.bias.detach().double().numpy()
    x = x.double().numpy()
    mem = x if memory is None else memory.double().numpy()
    outs, all_weights = [], []
    for n in range(x.shape[0]):
        heads, head_weights = [], []
        for i in range(h):
            rows = slice(i * dh, (i + 1) * dh)
            q = x[n] @ w_q[rows].T + b_q[rows]
            k = mem[n] @ w_k[rows].T + b_k[rows]
            v = mem[n] @ w_v[rows].T + b_v[rows]
            scores = q @ k.T / math.sqrt(dh)
            if allowed is not None:
                scores = np.where(allowed[n], scores, -np.inf)
            a = np.exp(scores - scores.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            heads.append(a @ v)
            head_weights.append(a)
        outs.append(np.concatenate(heads, axis=-1) @ w_o.T + b_o)
        all_weights.append(np.stack(head_weights))
    return np.stack(outs), np.stack(all_weights)


def make_mha(d=8, h=2):
    mha = MultiHeadAttention(d, h)
    with torch.no_grad():  # non-zero biases so that the bias blocks are checked too
        mha.in_proj.bias.normal_()
        mha.out_proj.bias.normal_()
    return mha.eval()


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_self_attention_equals_manual_heads(need_weights):
    mha = make_mha()
    x = torch.randn(2, 3, 8)
    out, weights = mha(x, need_weights=need_weights)
    expected, expected_w = manual_mha(mha, x)
    assert out.shape == (2, 3, 8)
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-5)
    if need_weights:
        assert weights.shape == (2, 2, 3, 3)
        np.testing.assert_allclose(weights.detach().numpy(), expected_w, atol=1e-6)
    else:
        assert weights is None


def test_mha_cross_attention_with_mask_equals_manual_heads():
    mha = make_mha()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])[:, None, None, :]
    out, weights = mha(x, memory, mask=mask, need_weights=True)
    allowed = mask[:, 0].expand(2, 3, 4).numpy()
    expected, expected_w = manual_mha(mha, x, memory, allowed)
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(weights.detach().numpy(), expected_w, atol=1e-6)
    assert float(weights.detach()[1, :, :, 2:].abs().max()) == 0.0


def test_mha_causal_equals_manual_heads():
    mha = make_mha()
    x = torch.randn(1, 4, 8)
    out, _ = mha(x, is_causal=True)
    allowed = np.tril(np.ones((4, 4), dtype=bool))[None]
    expected, _ = manual_mha(mha, x, allowed=allowed)
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-5)


def test_mha_rejects_indivisible_width():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4)


def test_mha_self_attention_cache_equals_causal():
    mha = make_mha()
    x = torch.randn(2, 5, 8)
    full, _ = mha(x, is_causal=True)
    cache = KVCache()
    steps = []
    for i in range(5):
        out, _ = mha(x[:, i:i + 1], cache=cache)
        steps.append(out)
        assert cache.length == i + 1
    assert cache.k.shape == (2, 2, 5, 4)
    assert float((torch.cat(steps, 1) - full).abs().max()) < 1e-6


def test_mha_cross_attention_cache_is_filled_once():
    mha = make_mha()
    x, memory = torch.randn(2, 1, 8), torch.randn(2, 4, 8)
    cache = KVCache()
    first, _ = mha(x, memory, cache=cache)
    k_first = cache.k
    # Later calls read the cache and ignore a (different) memory.
    second, _ = mha(x, torch.zeros_like(memory), cache=cache)
    assert cache.k is k_first and cache.length == 4
    assert torch.equal(first, second)
    expected, _ = mha(x, memory)
    assert float((first - expected).abs().max()) < 1e-6


def test_kv_cache_append_and_reorder():
    cache = KVCache()
    assert cache.length == 0
    cache.reorder(torch.tensor([0]))  # no-op on an empty cache
    k1, v1 = torch.arange(12.).view(3, 1, 2, 2), -torch.arange(12.).view(3, 1, 2, 2)
    cache.append(k1, v1)
    k, v = cache.append(k1[:, :, :1] + 100, v1[:, :, :1] + 100)
    assert cache.length == 3 and k.shape == (3, 1, 3, 2)
    assert torch.equal(k[:, :, :2], k1) and torch.equal(v[:, :, 2:], v1[:, :, :1] + 100)
    cache.reorder(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.k[0], k[2]) and torch.equal(cache.k[1], k[2]) and torch.equal(cache.v[2], v[0])


def test_kv_cache_reorders_lazily_into_the_next_append():
    """Reorders are recorded and composed, then applied by the next append in the same copy
    that lengthens the cache: the result equals reordering then concatenating."""
    torch.manual_seed(0)
    k0, v0 = torch.randn(4, 2, 3, 5), torch.randn(4, 2, 3, 5)
    k1, v1 = torch.randn(3, 2, 1, 5), torch.randn(3, 2, 1, 5)
    cache = KVCache()
    cache.append(k0, v0)
    cache.reorder(torch.tensor([3, 1, 1, 0]))
    cache.reorder(torch.tensor([2, 0, 3]))  # composed: rows 1, 3, 0 of the original
    k, v = cache.append(k1, v1)
    rows = torch.tensor([1, 3, 0])
    assert torch.equal(k, torch.cat([k0[rows], k1], dim=2)) and torch.equal(v, torch.cat([v0[rows], v1], dim=2))
    assert k.is_contiguous() and v.is_contiguous() and cache.length == 4
    cache.reorder(torch.tensor([2]))  # read before any append: applied by the read
    assert torch.equal(cache.k, k[2:]) and torch.equal(cache.v, v[2:])


def test_kv_cache_is_contiguous():
    """A strided cache would make every decoding step copy it before the matrix products."""
    cache = KVCache()
    kv = torch.randn(3, 5, 2, 4).transpose(1, 2)  # (B, h, T, d) as split from a projection: strided
    k, v = cache.append(kv, kv)
    assert k.is_contiguous() and v.is_contiguous() and torch.equal(k, kv)


@pytest.mark.parametrize("cached", [False, True])
def test_cross_attention_shares_memory_across_groups_of_rows(cached):
    """Beam search passes one memory row per sentence for its K hypotheses: the same outputs
    and weights as with the memory repeated K times, with keys and values cached once per sentence."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    sentences, beam, t, s = 3, 4, 2, 5
    memory = torch.randn(sentences, s, 8)
    mask = torch.ones(sentences, 1, 1, s, dtype=torch.bool)
    mask[1, ..., 3:] = False
    x = torch.randn(sentences * beam, t, 8)
    rows = torch.arange(sentences).repeat_interleave(beam)
    cache = KVCache() if cached else None
    shared, shared_w = mha(x, memory, mask, cache=cache, need_weights=True)
    repeated, repeated_w = mha(x, memory[rows], mask[rows], need_weights=True)
    assert shared.shape == (12, 2, 8) and shared_w.shape == (12, 2, 2, 5)
    assert float((shared - repeated).abs().max()) < 1e-6
    assert float((shared_w - repeated_w).abs().max()) < 1e-6
    assert float(shared_w[4:8, :, :, 3:].abs().max()) == 0.0  # sentence 1's padding, for all its rows
    if cached:
        assert cache.k.shape == (3, 2, 5, 4)
        again, _ = mha(x, memory, mask, cache=cache)   # without weights: the fused kernel on a block this small
        assert float((again - shared).abs().max()) < 1e-6
    with pytest.raises(ValueError, match="cannot share"):
        mha(x[:10], memory, mask)


def test_attention_dropout_only_in_training():
    mha = MultiHeadAttention(8, 2, attention_dropout=0.5)
    x = torch.randn(2, 6, 8)
    mha.eval()
    a, _ = mha(x)
    b, _ = mha(x)
    assert torch.equal(a, b)
    mha.train()
    c, _ = mha(x)
    assert float((a - c).abs().max()) > 1e-3
