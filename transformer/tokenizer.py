"""SentencePiece tokenizer with the package's fixed special-token ids.

The paper (§5.1) encodes sentences with byte-pair encoding and a shared source-target
vocabulary; SentencePiece BPE trained on both sides gives exactly that.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from .atomic import write_bytes
from .tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

TextMap = Callable[[list[str]], list[str]]


class Tokenizer:
    """Encode text to ids and decode ids to text with a SentencePiece model.

    ``preprocess`` (None: none) is applied to the texts ``encode`` reads: the form the model was
    trained on, where it is not the text as written (e.g. lowercased and word-tokenized). ``decode``
    gives the model's own form; ``for_reader`` turns that into text for a reader (``postprocess``,
    e.g. a detokenizer; None: as decoded)."""

    preprocess: TextMap | None = None
    postprocess: TextMap | None = None

    def __init__(self, model_file: str | os.PathLike) -> None:
        model_file = Path(model_file)
        if not model_file.is_file():
            raise FileNotFoundError(f"tokenizer model {model_file} does not exist")
        self.model_file = model_file
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(f"{model_file} has special ids {ids}, expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: Sequence[str], num_threads: int = -1) -> list[list[int]]:
        """Ids of each text (after ``preprocess``); ``num_threads`` -1 lets SentencePiece use every core."""
        return self.sp.encode(self.prepare(texts), out_type=int, num_threads=num_threads)

    def prepare(self, texts: Sequence[str]) -> list[str]:
        """The texts in the form the model reads (``preprocess``; as they are without one)."""
        return self.preprocess(list(texts)) if self.preprocess is not None else list(texts)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """The texts of ``ids`` in the model's own form (what it was trained to write)."""
        return self.sp.decode([list(i) for i in ids])

    def for_reader(self, texts: Sequence[str]) -> list[str]:
        """Decoded texts as a reader gets them (``postprocess``; as they are without one)."""
        return self.postprocess(list(texts)) if self.postprocess is not None else list(texts)

    def pieces(self, text: str) -> list[str]:
        return self.sp.encode(self.prepare([text])[0], out_type=str)


def train_tokenizer(texts: Iterable[str], model_file: str | os.PathLike, vocab_size: int, *,
                    model_type: str = "bpe", character_coverage: float = 1.0,
                    input_sentence_size: int = 2_000_000, seed: int = 1, num_threads: int = 2) -> Tokenizer:
    """Train a joint SentencePiece model on ``texts`` and write ``model_file`` atomically.

    ``input_sentence_size`` sentences are sampled from large corpora (shuffled with ``seed``).
    Raises ``ValueError`` when the corpus cannot support ``vocab_size`` pieces.
    """
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=num_threads, minloglevel=2, hard_vocab_limit=True,
        )
    except RuntimeError as err:
        if "Vocabulary size too high" in str(err) or "vocab_size" in str(err):
            raise ValueError(f"tokenizer.vocab_size {vocab_size} is larger than this corpus supports: {err}") from None
        raise
    write_bytes(model_file, model.getvalue())
    return Tokenizer(model_file)


def open_tokenizer(model_file: str | os.PathLike) -> Tokenizer:
    """``Tokenizer(model_file)``; a file that is not a SentencePiece model gives one ``ValueError``
    line instead of sentencepiece's OSError/RuntimeError report."""
    try:
        return Tokenizer(model_file)
    except (OSError, RuntimeError, ValueError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ValueError(f"{model_file} is not a usable SentencePiece model: {first}") from None
