"""Encoder and decoder layers (§3.1) and the position-wise feed-forward network (§3.3).

Shape key: B batch, S source length, T target length, D model width.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import KVCache, MultiHeadAttention
from .dropout import Dropout

if TYPE_CHECKING:  # annotations only
    from .config import ModelConfig

# The feed-forward activations by ``ModelConfig.activation`` name: the paper's ReLU (§3.3, eq. 2)
# and GELU (Hendrycks & Gimpel, 2016; a departure, exact erf form). The names are
# ``config.ACTIVATION_NAMES`` (config validation loads no layer code); ``FeedForward``,
# ``transformer.packed`` and the CTranslate2 export map a name to its function here.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3, eq. 2): max(0, xW1 + b1) W2 + b2.

    ``activation="gelu"`` replaces the ReLU (a departure from the paper).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.d_ff)
        self.linear2 = nn.Linear(config.d_ff, config.d_model)
        self.activation = ACTIVATIONS[config.activation]
        self.dropout = Dropout(config.activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class Residual(nn.Module):
    """Residual connection with layer normalisation around one sub-layer (§3.1, §5.4).

    Post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LN (``norm_first``, a departure): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)
        self.norm_first = config.norm_first

    def pre(self, x: Tensor) -> Tensor:
        """The sub-layer's input."""
        return self.norm(x) if self.norm_first else x

    def post(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """Combine the residual stream with the sub-layer's output."""
        y = x + self.dropout(sublayer_out)
        return y if self.norm_first else self.norm(y)


class EncoderLayer(nn.Module):
    """Encoder layer (§3.1): self-attention, then the feed-forward network."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.ffn = FeedForward(config)
        self.attn_residual = Residual(config)
        self.ffn_residual = Residual(config)

    def forward(self, x: Tensor, src_mask: Tensor | None, weights_out: list | None = None) -> Tensor:
        """x (B, S, D), src_mask (B, 1, 1, S) True at real tokens -> (B, S, D)."""
        h, w = self.self_attn(self.attn_residual.pre(x), mask=src_mask, need_weights=weights_out is not None)
        x = self.attn_residual.post(x, h)
        if weights_out is not None:
            weights_out.append(w)
        return self.ffn_residual.post(x, self.ffn(self.ffn_residual.pre(x)))


class DecoderLayer(nn.Module):
    """Decoder layer (§3.1): masked self-attention, encoder-decoder attention, feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.attention_dropout)
        self.ffn = FeedForward(config)
        self.self_residual = Residual(config)
        self.cross_residual = Residual(config)
        self.ffn_residual = Residual(config)

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, *,
        self_cache: KVCache | None = None, cross_cache: KVCache | None = None,
        self_weights_out: list | None = None, cross_weights_out: list | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, S, D), src_mask (B, 1, 1, S) -> (B, T, D).

        Without a cache the self-attention is causal over x; with one, x holds the new
        position(s) only and attends to everything cached before it.
        """
        causal = self_cache is None
        if causal or x.size(1) == 1:
            self_mask = None
        else:  # several new positions on top of a cache: causal, bottom-right aligned
            t, past = x.size(1), self_cache.length
            self_mask = x.new_ones(t, past + t, dtype=bool).tril(diagonal=past)
        h, w = self.self_attn(self.self_residual.pre(x), mask=self_mask, is_causal=causal,
                              cache=self_cache, need_weights=self_weights_out is not None)
        x = self.self_residual.post(x, h)
        if self_weights_out is not None:
            self_weights_out.append(w)
        h, w = self.cross_attn(self.cross_residual.pre(x), memory, mask=src_mask, cache=cross_cache,
                               need_weights=cross_weights_out is not None)
        x = self.cross_residual.post(x, h)
        if cross_weights_out is not None:
            cross_weights_out.append(w)
        return self.ffn_residual.post(x, self.ffn(self.ffn_residual.pre(x)))
