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
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.config.decoding import DecodingConfig
from pipeline.text.forms import attach
from pipeline.text.names import text_form_of
from transformer.checkpoint import CheckpointError, load_checkpoint, model_from_checkpoint
from transformer.model import Transformer
from transformer.packed import pack_linears, packing_available
from transformer.precision import default_device
from transformer.search import beam_search, greedy_search
from transformer.tokenizer import Tokenizer, open_tokenizer
from transformer.tokens import EOS_ID, PAD_ID


def check_vocabulary(model: Transformer, tokenizer: Tokenizer, model_source: str, tokenizer_source: str,
                     hint: str = "") -> None:
    """``CheckpointError`` unless the tokenizer has exactly the model's vocabulary size: another
    tokenizer's ids are not the rows of this model's embedding. ``hint`` ends the message (what to do)."""
    if tokenizer.vocab_size != model.config.vocab_size:
        raise CheckpointError(f"{model_source} has a vocabulary of {model.config.vocab_size} but {tokenizer_source} "
                              f"has {tokenizer.vocab_size} pieces: the model was trained with another tokenizer"
                              + (f"; {hint}" if hint else ""))


def load_translator(model: str | os.PathLike | Mapping[str, Any], tokenizer_file: str | os.PathLike,
                    decoding: DecodingConfig | None = None, device: torch.device | str | None = None,
                    model_source: str | None = None, hint: str = "") -> Translator:
    """The translator of a model file (or an already loaded checkpoint) and its SentencePiece model.

    The tokenizer prepares sources in the text form the checkpoint names (``pipeline.text.forms``).
    Raises ``CheckpointError`` (model missing or unusable, or a tokenizer of another vocabulary)
    and ``ValueError`` (not a usable SentencePiece model, an unknown text form), each one line.
    """
    device = torch.device(device) if device is not None else default_device()
    if isinstance(model, Mapping):
        source = model_source or "checkpoint"
        checkpoint = dict(model)
    else:
        source = model_source or str(model)
        checkpoint = load_checkpoint(model, device)
    net = model_from_checkpoint(checkpoint, source).to(device)
    form = text_form_of(checkpoint, source)   # before the tokenizer: an unknown form is one line
    tokenizer = attach(open_tokenizer(tokenizer_file), form)
    check_vocabulary(net, tokenizer, source, str(tokenizer_file), hint)
    return Translator(net, tokenizer, decoding or DecodingConfig())


@dataclass
class Translator:
    """A model and its tokenizer decoding with ``decoding`` (checked there, once). ``packed``: the
    linear layers on oneDNN-packed weights where available (CPU), on a copy of the model."""

    model: Transformer
    tokenizer: Tokenizer
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    packed: bool = True

    def __post_init__(self) -> None:
        if self.decoding.precision == "bf16":
            # Weights cast once: autocast would re-cast them at every decoding step (measured
            # slower than fp32). 1.8x faster than fp32 on this CPU, BLEU within 0.05.
            self.model = copy.deepcopy(self.model).to(torch.bfloat16)
        if self.packed and self.device.type == "cpu" and packing_available():
            # On a copy: the caller's model keeps its plain, trainable layers.
            model = self.model if self.decoding.precision == "bf16" else copy.deepcopy(self.model)
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
                      alpha: float | None = None, stopping: str | None = None) -> list[list[int]]:
        """Hypotheses of each source, longest sources batched first. ``beam_size``/``alpha``/``stopping``
        override this translator's for one call (without changing it: a server decodes concurrent
        requests with one translator)."""
        d = self.decoding
        beam_size = d.beam_size if beam_size is None else beam_size
        alpha = d.alpha if alpha is None else alpha
        stopping = d.stopping if stopping is None else stopping
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        out: list[list[int]] = [[] for _ in ids]
        self.model.eval()
        max_len_b = min(d.max_len_b, self.model.config.max_positions - 1)
        for start in range(0, len(order), d.batch_sentences):
            chunk = order[start:start + d.batch_sentences]
            src = self.source_tensor([ids[i] for i in chunk])
            if beam_size == 1:
                result = greedy_search(self.model, src, max_len_b=max_len_b)
            else:
                result = beam_search(self.model, src, beam_size=beam_size, alpha=alpha, max_len_b=max_len_b,
                                     stopping=stopping)
            for i, hyp in zip(chunk, result.hypotheses):
                out[i] = hyp
        return out

    def translate(self, sentences: Sequence[str], beam_size: int | None = None,
                  alpha: float | None = None, stopping: str | None = None) -> list[str]:
        if not sentences:
            return []
        return self.tokenizer.decode(self.translate_ids(self.tokenizer.encode(sentences), beam_size, alpha, stopping))
