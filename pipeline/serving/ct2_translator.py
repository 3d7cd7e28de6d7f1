"""Translate with the export stage's CTranslate2 model: the interface of
``pipeline.serving.translator.Translator`` (``translate``, ``translate_ids``) over
``ctranslate2.Translator.translate_batch`` (beam search, §6.1, in CTranslate2's C++ steps).

Our decoding settings mapped onto CTranslate2's (``pipeline.config.decoding.DecodingConfig`` says
what each means for each engine): the sources are cut to the model's positions as ours are; one call
decodes the sentences whose length limit (source + max_len_b, ours per sentence) rounds up to the
same multiple of ``LIMIT_BUCKET`` in one asynchronous call with that rounded limit as its
``max_decoding_length`` (CTranslate2 takes one per call), batched by CTranslate2 (``max_batch_size``
= batch_sentences) over its ``inter_threads``, and cuts each hypothesis to its own limit. So a
sentence's translation is a function of the sentence alone, never of the others in its batch (one
limit for a whole call, the longest sentence's, let a short sentence's hypotheses run on past its own
limit, which can change which one wins). Padding and BOS are suppressed as in ``transformer.search``;
its length penalty is |Y| ** alpha (not GNMT's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.config.decoding import DecodingConfig
from transformer.tokenizer import Tokenizer, open_tokenizer
from transformer.tokens import BOS_ID, PAD_ID

VOCABULARY_FILE = "shared_vocabulary.json"   # the export's pieces in id order
TOKENIZER_FILE = "spm.model"                 # the export's copy of the SentencePiece model
LIMIT_BUCKET = 16                            # decoding lengths are rounded up to a multiple of this


class EngineUnavailable(RuntimeError):
    """CTranslate2 cannot decode here (not installed, no exported model, or it cannot load it);
    the message is why, in a few words."""


class CT2Translator:
    """A CTranslate2 model and its tokenizer decoding with ``decoding`` (engine ctranslate2)."""

    def __init__(self, engine: Any, tokenizer: Tokenizer, vocabulary: Sequence[str], decoding: DecodingConfig,
                 max_positions: int) -> None:
        self.engine = engine   # a ctranslate2.Translator
        self.tokenizer = tokenizer
        self.vocabulary = list(vocabulary)
        self.index = {piece: i for i, piece in enumerate(self.vocabulary)}
        self.decoding = decoding
        self.max_positions = max_positions
        # Label smoothing gives both mass (§5.4); neither is ever a target (transformer.search._never_emitted).
        self.suppressed = [[self.vocabulary[PAD_ID]], [self.vocabulary[BOS_ID]]]

    @property
    def max_source_tokens(self) -> int:
        """Source pieces the model has positions for (one more is the EOS); longer sources are cut."""
        return self.max_positions - 1

    def limits(self, ids: Sequence[Sequence[int]]) -> list[int]:
        """Each sentence's most output pieces before EOS: source + max_len_b within the positions
        (``transformer.search._max_lengths``, less the EOS)."""
        return [min(len(s) + self.decoding.max_len_b, self.max_positions - 1) for s in ids]

    def translate_ids(self, ids: Sequence[Sequence[int]], beam_size: int | None = None,
                      alpha: float | None = None, stopping: str | None = None) -> list[list[int]]:
        """Hypotheses of each source. ``beam_size``/``alpha``/``stopping`` override the translator's
        for one call; ``stopping`` is checked as a setting (``exact`` is refused: ValueError)."""
        if not ids:
            return []
        d = self.decoding.replace(beam_size=beam_size, alpha=alpha, stopping=stopping)
        sources = [list(s[:self.max_source_tokens]) for s in ids]
        limits = self.limits(sources)
        by_bucket: dict[int, list[int]] = {}
        for i, limit in enumerate(limits):
            by_bucket.setdefault(self.bucket(limit), []).append(i)
        calls = [(rows, self.engine.translate_batch(
            [[self.vocabulary[t] for t in sources[i]] for i in rows], max_batch_size=d.batch_sentences,
            batch_type="examples", beam_size=d.beam_size, length_penalty=d.alpha, max_decoding_length=bucket,
            min_decoding_length=0, max_input_length=0, suppress_sequences=self.suppressed, asynchronous=True))
            for bucket, rows in by_bucket.items()]
        out: list[list[int]] = [[] for _ in sources]
        for rows, results in calls:
            for i, result in zip(rows, results):
                out[i] = [self.index[p] for p in result.result().hypotheses[0]][:limits[i]]
        return out

    def bucket(self, limit: int) -> int:
        """The ``max_decoding_length`` a sentence of this limit is decoded with: the limit rounded up
        to a multiple of ``LIMIT_BUCKET`` (within the positions). A function of the sentence alone, so
        its translation never depends on its batch, and few enough calls to keep CTranslate2's
        batches full (one call per exact limit decoded the test set 1.5x slower)."""
        return min(-(-limit // LIMIT_BUCKET) * LIMIT_BUCKET, self.max_positions - 1)

    def translate(self, sentences: Sequence[str], beam_size: int | None = None,
                  alpha: float | None = None, stopping: str | None = None) -> list[str]:
        if not sentences:
            return []
        return self.tokenizer.decode(self.translate_ids(self.tokenizer.encode(sentences), beam_size, alpha, stopping))


def default_threads() -> tuple[int, int]:
    """(inter_threads, intra_threads) for one caller decoding batches one after another: one
    translation at a time on every core this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1, cores


def load_ct2_translator(model_dir: str | os.PathLike, tokenizer_file: str | os.PathLike, decoding: DecodingConfig,
                        max_positions: int, device: str = "cpu",
                        threads: tuple[int, int] | None = None) -> CT2Translator:
    """The CTranslate2 translator of an exported model directory (``pipeline.stages.export``) at
    ``decoding.compute_type``. ``threads``: (inter_threads, intra_threads), default ``default_threads``.

    Raises ``EngineUnavailable`` when CTranslate2 is missing, the directory is no export, the
    tokenizer is not the export's, or CTranslate2 cannot load it on ``device``."""
    model_dir = Path(model_dir)
    try:
        import ctranslate2
    except ImportError as err:
        raise EngineUnavailable(f"is not installed ({err})") from None
    if not (model_dir / "model.bin").is_file() or not (model_dir / VOCABULARY_FILE).is_file():
        raise EngineUnavailable(f"has no exported model in {model_dir} (python -m pipeline.stages.export)")
    vocabulary = json.loads((model_dir / VOCABULARY_FILE).read_text(encoding="utf-8"))
    tokenizer = open_tokenizer(tokenizer_file)
    if tokenizer.vocab_size != len(vocabulary):
        raise EngineUnavailable(f"model {model_dir} has {len(vocabulary)} pieces but {tokenizer_file} has "
                                f"{tokenizer.vocab_size}: exported with another tokenizer")
    inter, intra = threads or default_threads()
    try:
        engine = ctranslate2.Translator(str(model_dir), device=device, compute_type=decoding.compute_type,
                                        inter_threads=inter, intra_threads=intra)
    except (RuntimeError, ValueError) as err:   # e.g. a CUDA the wheel does not support, a compute type the CPU lacks
        raise EngineUnavailable(f"cannot load {model_dir} on {device} ({' '.join(str(err).split())})") from None
    return CT2Translator(engine, tokenizer, vocabulary, decoding, max_positions)
