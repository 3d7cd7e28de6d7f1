"""Translate text with a trained model and its tokenizer: batching by length around the
package's beam search (§6.1)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from transformer.packed import pack_linears, packing_available
from transformer.model import Transformer
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import Tokenizer
from transformer.tokens import EOS_ID, PAD_ID


@dataclass
class Translator:
    model: Transformer
    tokenizer: Tokenizer
    beam_size: int = 4
    alpha: float = 0.6
    max_len_b: int = 50
    batch_sentences: int = 64
    precision: str = "fp32"
    packed: bool = True

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"decoding precision must be fp32 or bf16, got {self.precision!r}")
        if self.precision == "bf16":
            # Weights cast once: autocast would re-cast them at every decoding step (measured
            # slower than fp32). 1.8x faster than fp32 on this CPU, BLEU within 0.05.
            self.model = copy.deepcopy(self.model).to(torch.bfloat16)
        if self.packed and self.device.type == "cpu" and packing_available():
            # On a copy: the caller's model keeps its plain, trainable layers.
            model = self.model if self.precision == "bf16" else copy.deepcopy(self.model)
            self.model = pack_linears(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def source_tensor(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Pad encoded sentences (+EOS) into a (B, S) tensor, truncated to the model's positions."""
        limit = self.model.config.max_positions - 1
        rows = [list(r[:limit]) + [EOS_ID] for r in ids]
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return out.to(self.device)

    def translate_ids(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        out: list[list[int]] = [[] for _ in ids]
        self.model.eval()
        max_len_b = min(self.max_len_b, self.model.config.max_positions - 1)
        for start in range(0, len(order), self.batch_sentences):
            chunk = order[start:start + self.batch_sentences]
            src = self.source_tensor([ids[i] for i in chunk])
            if self.beam_size == 1:
                result = greedy_search(self.model, src, max_len_b=max_len_b)
            else:
                result = beam_search(self.model, src, beam_size=self.beam_size, alpha=self.alpha,
                                     max_len_b=max_len_b)
            for i, hyp in zip(chunk, result.hypotheses):
                out[i] = hyp
        return out

    def translate(self, sentences: Sequence[str]) -> list[str]:
        if not sentences:
            return []
        return self.tokenizer.decode(self.translate_ids(self.tokenizer.encode(sentences)))
