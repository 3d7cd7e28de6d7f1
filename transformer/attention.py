"""Scaled dot-product and multi-head attention (§3.2), with a key/value cache.

Shape key: B batch, h heads, T query length, S key length, D model width, d head width.
Masks are boolean and True where attention is allowed (PyTorch's convention).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Query rows (batch x heads x queries) up to which CPU attention without weights takes PyTorch's
# fused kernel: a beam of one or a few sentences per decoding step, where operator calls, not
# arithmetic, cost the time (bench/decode_latency.py).
FUSED_CPU_MAX_ROWS = 64


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
    dropout_p: float = 0.0, is_causal: bool = False, return_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention (§3.2.1, eq. 1): softmax(QK^T / sqrt(d_k)) V.

    Args:
        q: (..., T, d); k: (..., S, d); v: (..., S, d_v).
        mask: boolean, broadcastable to (..., T, S), True where a query may attend.
        is_causal: forbid query i to attend to keys j > i (top-left aligned, as PyTorch's).
        return_weights: also return the attention weights (..., T, S); otherwise the weights
            are None and, on GPUs, PyTorch's fused kernel computes the output. On CPU the
            explicit form below is faster for translation-length sequences (measured: 3.6 ms
            against 27 ms for PyTorch's CPU flash kernel, forward and backward, bf16,
            B=200, h=4, T=20), so it is used there, except for blocks of at most
            ``FUSED_CPU_MAX_ROWS`` query rows (one sentence's beam in incremental decoding), where
            the fused kernel's one operator call costs less than the explicit form's dozen.
    Returns:
        (output (..., T, d_v), weights or None)
    """
    fused = q.device.type != "cpu" or (q.numel() <= FUSED_CPU_MAX_ROWS * q.size(-1)
                                        and not (is_causal and mask is not None))
    if not return_weights and fused:
        if is_causal and mask is not None:
            raise ValueError("pass either a mask or is_causal=True, not both")
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                             is_causal=is_causal)
        return out, None
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if is_causal:
        t, s = scores.shape[-2:]
        causal = torch.ones(t, s, dtype=torch.bool, device=q.device).tril()
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return torch.matmul(dropped, v), weights if return_weights else None


class KVCache:
    """Keys and values of one attention layer, kept across decoding steps (B, h, S, d).

    Self-attention appends one step at a time; cross-attention fills it once from the
    encoder output and then only reads it. Both are kept contiguous: a strided view of
    the projection would make every step's ``q @ k^T`` and ``weights @ v`` copy the whole
    cache first (measured: a third of beam search time on CPU).

    ``reorder`` only records the rows to keep; the next ``append`` copies them straight into
    the longer cache (or the next read of ``k``/``v`` applies it), so a beam search step
    copies the cache once rather than once to reorder and once to lengthen it.
    """

    def __init__(self) -> None:
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._index: Tensor | None = None  # rows to keep, not yet applied

    @property
    def k(self) -> Tensor | None:
        self._apply_reorder()
        return self._k

    @property
    def v(self) -> Tensor | None:
        self._apply_reorder()
        return self._v

    @property
    def length(self) -> int:
        return 0 if self._k is None else self._k.size(-2)

    def _apply_reorder(self) -> None:
        if self._index is not None:
            self._k, self._v = self._k.index_select(0, self._index), self._v.index_select(0, self._index)
            self._index = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add positions k, v (B, h, T, d) after the cached ones; returns the whole cache."""
        if self._k is None:
            self._k, self._v = k.contiguous(), v.contiguous()
            return self._k, self._v
        past, rows = self.length, k.size(0)
        longer = []
        for old, new in ((self._k, k), (self._v, v)):
            out = new.new_empty(rows, new.size(1), past + new.size(2), new.size(3))
            if self._index is None:
                out[:, :, :past] = old
            else:
                torch.index_select(old, 0, self._index, out=out[:, :, :past])
            out[:, :, past:] = new
            longer.append(out)
        self._k, self._v = longer
        self._index = None
        return self._k, self._v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search reordering and pruning)."""
        if self._k is not None:
            self._index = index if self._index is None else self._index.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2): Concat(head_1..head_h) W^O, head_i = Attn(QW^Q_i, KW^K_i, VW^V_i).

    W^Q, W^K and W^V are stored as the three row blocks of one ``in_proj`` matrix so that
    self-attention projects with a single matrix product (faster on every device).
    """

    def __init__(self, d_model: int, n_heads: int, attention_dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads = d_model, n_heads
        self.attention_dropout = attention_dropout
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # "qkv", "q", "kv" -> a packed projection for CPU inference (``transformer.packed``), or None.
        self.packed_projections: dict[str, nn.Module] | None = None

    def _project(self, x: Tensor, part: str) -> Tensor:
        """x W^T + b for the rows of ``in_proj`` named by ``part``: "qkv" (all), "q" or "kv"."""
        if self.packed_projections is not None:
            return self.packed_projections[part](x)
        w, bias = self.in_proj.weight, self.in_proj.bias
        if part == "qkv":
            return F.linear(x, w, bias)
        rows = slice(0, self.d_model) if part == "q" else slice(self.d_model, None)
        return F.linear(x, w[rows], bias[rows])

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape  # (B, T, D) -> (B, h, T, d)
        return x.view(b, t, self.n_heads, -1).transpose(1, 2)

    def forward(
        self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None, *,
        is_causal: bool = False, cache: KVCache | None = None, need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, T, D) to itself, or to ``memory`` (M, S, D) when given.

        With a cache, self-attention appends this step's keys and values to it, and
        cross-attention computes them from ``memory`` on the first call only.

        ``memory`` may hold one row per group of B / M consecutive rows of ``x`` (beam search:
        the K hypotheses of a sentence share its encoder output). The group's queries then
        attend together as one (M, h, B/M * T, d) block, so keys and values are projected,
        cached and read once per sentence rather than once per hypothesis; ``mask`` is (M, ...).
        Returns (output (B, T, D), weights (B, h, T, S) or None).
        """
        d = self.d_model
        if memory is None:  # (B, T, 3D) -> 3 x (B, h, T, d) in one permuted view
            q, k, v = self._project(x, "qkv").view(x.size(0), x.size(1), 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self._split(self._project(x, "q"))
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._project(memory, "kv").split(d, dim=-1)
                k, v = self._split(k), self._split(v)
                if cache is not None:
                    k, v = cache.append(k, v)
        b, h, t, d_head = q.shape
        groups, rem = divmod(b, k.size(0))
        if rem:
            raise ValueError(f"{b} query rows cannot share {k.size(0)} rows of keys and values")
        if groups > 1:  # (G*M, h, T, d) -> (M, h, G*T, d)
            q = q.view(-1, groups, h, t, d_head).transpose(1, 2).reshape(-1, h, groups * t, d_head)
        dropout_p = self.attention_dropout if self.training else 0.0
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, dropout_p=dropout_p, is_causal=is_causal, return_weights=need_weights)
        if groups > 1:  # (M, h, G*T, .) -> (G*M, h, T, .)
            out = out.view(-1, h, groups, t, d_head).transpose(1, 2).reshape(b, h, t, d_head)
            if weights is not None:
                weights = weights.view(-1, h, groups, t, weights.size(-1)).transpose(1, 2).reshape(b, h, t, -1)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d)), weights
