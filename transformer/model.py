"""The encoder-decoder Transformer (§3, Figure 1).

Shape key: B batch, S source length, T target length, D model width, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .attention import KVCache
from .config import ModelConfig
from .dropout import Dropout
from .layers import DecoderLayer, EncoderLayer
from .positional import POSITIONAL


@dataclass
class DecoderCache:
    """Per-layer key/value caches for incremental decoding (``Transformer.new_cache``).

    Self-attention caches hold one row per target row (a hypothesis); cross-attention caches
    hold one row per row of the encoder output (a sentence), computed from it at the first
    step. ``Transformer.reorder_cache`` and ``Transformer.select_sentences`` move them.
    """

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    @classmethod
    def empty(cls, n_layers: int) -> DecoderCache:
        return cls([KVCache() for _ in range(n_layers)], [KVCache() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Number of target positions decoded so far."""
        return self.self_attn[0].length


@dataclass
class AttentionWeights:
    """Attention weights of every layer, each (B, h, query length, key length)."""

    encoder: list[Tensor] = field(default_factory=list)
    decoder_self: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)


class Embedding(nn.Module):
    """Token embeddings multiplied by sqrt(d_model) (§3.4), plus positions (§3.5), then dropout (§5.4)."""

    def __init__(self, config: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(config.d_model)
        self.positions = POSITIONAL[config.positional](config.max_positions, config.d_model)
        self.dropout = Dropout(config.dropout)

    def forward(self, ids: Tensor, offset: int = 0) -> Tensor:
        """ids (B, L) -> (B, L, D); ``offset`` is the position of ids[:, 0]."""
        x = self.tokens(ids) * self.scale + self.positions(ids.size(1), offset)
        return self.dropout(x)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3).

    ``encode`` runs once per source batch; ``decode`` runs the decoder over a whole target
    prefix (training) or, with a ``DecoderCache``, over new positions only (inference).

    Incremental decoding contract (what a search calls; fairseq's ``reorder_encoder_out`` and
    ``reorder_incremental_state``): ``encode``, ``new_cache``, then per step ``decode_step``;
    ``reorder_cache`` when hypotheses are reordered or pruned and ``select_sentences`` when
    sentences leave the batch. The target rows may be G consecutive rows per encoder row (the
    G hypotheses of one sentence share its encoder output): the cross-attention then projects,
    caches and reads keys and values once per sentence (``MultiHeadAttention``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        src_tokens = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_id)
        tgt_tokens = src_tokens if config.share_embeddings else nn.Embedding(
            config.vocab_size, config.d_model, padding_idx=config.pad_id)
        self.src_embed = Embedding(config, src_tokens)
        self.tgt_embed = Embedding(config, tgt_tokens)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        # Pre-LN stacks end with a LayerNorm; post-LN layers already end with one.
        self.encoder_norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model) if config.norm_first else nn.Identity()
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        # §3.4: the pre-softmax projection shares its weight with the target embedding.
        self.output.weight = tgt_tokens.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                # N(0, d^-1/2) so that embeddings scaled by sqrt(d) have unit variance (learned
                # positions included: the same law as their own initialisation).
                nn.init.normal_(module.weight, std=self.config.d_model ** -0.5)
                if module.padding_idx is not None:
                    nn.init.zeros_(module.weight[module.padding_idx])

    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, 1, 1, S) boolean, True at real (non-pad) tokens."""
        return (src != self.config.pad_id)[:, None, None, :]

    def encode(self, src: Tensor, weights: AttentionWeights | None = None) -> tuple[Tensor, Tensor]:
        """Encoder stack (§3.1). src (B, S) -> (memory (B, S, D), src_mask (B, 1, 1, S))."""
        src_mask = self.source_mask(src)
        x = self.src_embed(src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask, weights.encoder if weights is not None else None)
        return self.encoder_norm(x), src_mask

    def decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache | None = None,
        weights: AttentionWeights | None = None, project: bool = True,
    ) -> Tensor:
        """Decoder stack and output projection (§3.1, §3.4). tgt (B, T) -> logits (B, T, V), or
        with ``project=False`` the states before the projection, (B, T, D).

        With ``cache``, tgt holds only positions cache.length .. cache.length+T-1. ``memory``
        (M, S, D) and ``src_mask`` (M, 1, 1, S) may hold one row per group of B / M consecutive
        target rows (the hypotheses of one sentence in beam search).
        """
        offset = cache.length if cache is not None else 0
        x = self.tgt_embed(tgt, offset)
        for i, layer in enumerate(self.decoder_layers):
            x = layer(
                x, memory, src_mask,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None else None,
                self_weights_out=weights.decoder_self if weights is not None else None,
                cross_weights_out=weights.cross if weights is not None else None,
            )
        x = self.decoder_norm(x)
        return self.output(x) if project else x

    def new_cache(self) -> DecoderCache:
        """An empty cache for ``decode``/``decode_step``: filled by the first step."""
        return DecoderCache.empty(len(self.decoder_layers))

    def decode_step(self, tokens: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache) -> Tensor:
        """Next-token log-probabilities (the softmax of §3.4), in float32, after one new position
        per target row. tokens (B, 1), memory (M, S, D) with B / M rows per encoder row -> (B, V)."""
        return torch.log_softmax(self.decode(tokens, memory, src_mask, cache)[:, -1].float(), dim=-1)

    def reorder_cache(self, cache: DecoderCache, order: Tensor) -> None:
        """Target row i continues target row ``order[i]`` (beam reordering, pruning): the
        self-attention caches follow. Recorded only: the next step's append copies the rows
        straight into the longer cache (``KVCache.reorder``), one copy per step."""
        for layer_cache in cache.self_attn:
            layer_cache.reorder(order)

    def select_sentences(self, memory: Tensor, src_mask: Tensor, sentences: Tensor,
                         cache: DecoderCache | None = None) -> tuple[Tensor, Tensor]:
        """Keep the encoder rows ``sentences`` (finished sentences leave the batch): returns
        memory (M', S, D) and src_mask (M', 1, 1, S), and the cross-attention caches follow.
        Target rows are moved by ``reorder_cache``, with each sentence's hypotheses kept together."""
        if cache is not None:
            for layer_cache in cache.cross_attn:
                layer_cache.reorder(sentences)
        return memory[sentences], src_mask[sentences]

    def forward(self, src: Tensor, tgt_in: Tensor, weights: AttentionWeights | None = None,
                project: bool = True) -> Tensor:
        """Teacher-forced logits: src (B, S), tgt_in (B, T) starting with BOS -> (B, T, V); with
        ``project=False`` the decoder's output states (B, T, D), for a loss that projects them itself
        (``transformer.training.loss.projected_label_smoothed_cross_entropy`` with ``self.output.weight``)."""
        memory, src_mask = self.encode(src, weights)
        return self.decode(tgt_in, memory, src_mask, weights=weights, project=project)

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a tied matrix counts once)."""
        return sum(p.numel() for p in self.parameters())
