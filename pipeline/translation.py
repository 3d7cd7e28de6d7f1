"""Translate text with a trained model and its tokenizer: batching by length around the
package's beam search (§6.1).

``load_translator`` is the one way every caller (the translate command, the evaluate stage,
the promotion gate, the MLflow pyfunc model) builds a translator from files: it checks that the
tokenizer is the model's (same vocabulary size) so a mismatched pair fails with one line
instead of translating with the wrong pieces.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from transformer.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
from transformer.model import Transformer
from transformer.packed import pack_linears, packing_available
from transformer.precision import default_device
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import Tokenizer, open_tokenizer
from transformer.tokens import EOS_ID, PAD_ID


@dataclass(frozen=True)
class DecodingConfig:
    """How a translator decodes; the defaults are the paper's (§6.1: beam 4, length penalty alpha
    0.6, output up to source length + 50). (``pipeline.params.Decoding`` is another thing: the beam
    size and alpha the evaluate stage chose, and where each came from.)"""

    beam_size: int = 4
    alpha: float = 0.6
    max_len_b: int = 50
    batch_sentences: int = 64
    precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.max_len_b < 1 or self.batch_sentences < 1:
            raise ValueError(f"max_len_b and batch_sentences must be positive, got {self.max_len_b} "
                             f"and {self.batch_sentences}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"decoding precision must be fp32 or bf16, got {self.precision!r}")

    @classmethod
    def of(cls, settings: Any) -> DecodingConfig:
        """From a mapping or an object with these attributes (``params.evaluate``); other keys
        (``attention_sentences``) are ignored, missing or None ones keep the paper's defaults."""
        get = settings.get if isinstance(settings, Mapping) else lambda k: getattr(settings, k, None)
        return cls(**{f.name: get(f.name) for f in fields(cls) if get(f.name) is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_vocabulary(model: Transformer, tokenizer: Tokenizer, model_source: str, tokenizer_source: str) -> None:
    """``CheckpointError`` unless the tokenizer has exactly the model's vocabulary size: another
    tokenizer's ids are not the rows of this model's embedding."""
    if tokenizer.vocab_size != model.config.vocab_size:
        raise CheckpointError(f"{model_source} has a vocabulary of {model.config.vocab_size} but {tokenizer_source} "
                              f"has {tokenizer.vocab_size} pieces: the model was trained with another tokenizer")


def load_translator(model: str | os.PathLike | Mapping[str, Any], tokenizer_file: str | os.PathLike,
                    decoding: DecodingConfig | None = None, device: torch.device | str | None = None,
                    model_source: str | None = None) -> Translator:
    """The translator of a model file (or an already loaded checkpoint) and its SentencePiece model.

    Raises ``CheckpointError`` (model missing or unusable, or a tokenizer of another vocabulary)
    and ``ValueError`` (not a usable SentencePiece model), each one line.
    """
    device = torch.device(device) if device is not None else default_device()
    if isinstance(model, Mapping):
        source = model_source or "checkpoint"
        net = model_from_checkpoint(dict(model), source).to(device)
    else:
        source = model_source or str(model)
        net = model_from_checkpoint(load_checkpoint(model, device), source).to(device)
    tokenizer = open_tokenizer(tokenizer_file)
    check_vocabulary(net, tokenizer, source, str(tokenizer_file))
    d = decoding or DecodingConfig()
    return Translator(net, tokenizer, d.beam_size, d.alpha, d.max_len_b, d.batch_sentences, d.precision)


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

    @property
    def max_source_tokens(self) -> int:
        """Source pieces the model has positions for (one more is the EOS); longer sources are cut."""
        return self.model.config.max_positions - 1

    def source_tensor(self, ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Pad encoded sentences (+EOS) into a (B, S) tensor, truncated to the model's positions."""
        limit = self.model.config.max_positions - 1
        rows = [list(r[:limit]) + [EOS_ID] for r in ids]
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return out.to(self.device)

    def translate_ids(self, ids: Sequence[Sequence[int]], beam_size: int | None = None,
                      alpha: float | None = None) -> list[list[int]]:
        """Hypotheses of each source, longest sources batched first. ``beam_size``/``alpha`` override
        this translator's for one call (without changing it: a server decodes concurrent requests
        with one translator)."""
        beam_size = self.beam_size if beam_size is None else beam_size
        alpha = self.alpha if alpha is None else alpha
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        out: list[list[int]] = [[] for _ in ids]
        self.model.eval()
        max_len_b = min(self.max_len_b, self.model.config.max_positions - 1)
        for start in range(0, len(order), self.batch_sentences):
            chunk = order[start:start + self.batch_sentences]
            src = self.source_tensor([ids[i] for i in chunk])
            if beam_size == 1:
                result = greedy_search(self.model, src, max_len_b=max_len_b)
            else:
                result = beam_search(self.model, src, beam_size=beam_size, alpha=alpha, max_len_b=max_len_b)
            for i, hyp in zip(chunk, result.hypotheses):
                out[i] = hyp
        return out

    def translate(self, sentences: Sequence[str], beam_size: int | None = None,
                  alpha: float | None = None) -> list[str]:
        if not sentences:
            return []
        return self.tokenizer.decode(self.translate_ids(self.tokenizer.encode(sentences), beam_size, alpha))
