"""The form of the text a model reads and writes (``tokenizer.text_form``).

- ``raw``: the corpus as published, cased and detokenized; what the default recipe trains on
  (§5.1: byte-pair encoding of the sentences themselves).
- ``lc_norm_tok``: the Multi30k literature's form (Wu et al. 2021 among others): every training
  sentence, both sides, put through upstream's ``lowercase.perl | normalize-punctuation.perl |
  tokenizer.perl`` (``pipeline.text.moses.lc_norm_tok``, the very function that makes
  hypotheses comparable with the ``lc.norm.tok`` references) before SentencePiece learns its pieces.
  A model of this form writes that form itself: its hypotheses are scored against the references as
  they are (never put through the tokenizer a second time, which would escape ``&apos;`` into
  ``&amp;apos;``), and a reader gets them detokenized (``MosesDetokenizer``, which unescapes).

The tokenizer stage writes the form into ``data/tokens/stats.json``, the train stage into every
checkpoint (``CHECKPOINT_KEY``), the average stage into the averaged model: a model file says the form
it reads, so whoever loads one (tune, evaluate, the pyfunc model, the server) prepares its input alike
(``attach``). ``raw`` is stored nowhere: a raw model's files are the bytes they always were.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from transformer.tokenizer import Tokenizer

RAW = "raw"
LC_NORM_TOK = "lc_norm_tok"
TEXT_FORMS = (RAW, LC_NORM_TOK)
CHECKPOINT_KEY = "text_form"   # in a checkpoint and in data/tokens/stats.json, absent for raw
CHUNK_LINES = 10_000           # lines prepared at a time: a corpus is streamed, never held whole


class TextFormError(ValueError):
    """A stored text form that this code does not know (a newer file, or a damaged one)."""


@dataclass(frozen=True)
class TextForm:
    """A text form and the languages it was made for (normalization and tokenization are per language)."""

    name: str = RAW
    src_lang: str = ""
    tgt_lang: str = ""

    def __post_init__(self) -> None:
        if self.name not in TEXT_FORMS:
            raise TextFormError(f"unknown text form {self.name!r}: expected one of {', '.join(TEXT_FORMS)}")
        if self.name != RAW and not (self.src_lang and self.tgt_lang):
            raise TextFormError(f"text form {self.name!r} needs its source and target languages")

    @property
    def is_raw(self) -> bool:
        return self.name == RAW

    @property
    def literature(self) -> bool:
        """Whether the model writes the Multi30k literature's form (scored as it is, ``bleu_lc_tok``)."""
        return self.name == LC_NORM_TOK

    def entry(self) -> dict[str, str] | None:
        """What a checkpoint or stats file stores (None for raw: nothing is stored)."""
        if self.is_raw:
            return None
        return {"name": self.name, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang}

    def prepare(self, lines: list[str], lang: str) -> list[str]:
        """``lines`` of language ``lang`` in this form."""
        if self.is_raw:
            return lines
        from pipeline.text.moses import lc_norm_tok

        return lc_norm_tok(lines, lang)

    def stream(self, lines: Iterable[str], lang: str) -> Iterator[str]:
        """``prepare`` over a stream, ``CHUNK_LINES`` at a time."""
        if self.is_raw:
            yield from lines
            return
        chunk: list[str] = []
        for line in lines:
            chunk.append(line)
            if len(chunk) == CHUNK_LINES:
                yield from self.prepare(chunk, lang)
                chunk = []
        if chunk:
            yield from self.prepare(chunk, lang)

    def for_reader(self, lines: list[str]) -> list[str]:
        """Target-side text of this form as a reader gets it: detokenized and unescaped (still lowercase)."""
        if self.is_raw:
            return lines
        detokenizer = _detokenizer(self.tgt_lang)
        return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]


@functools.lru_cache(maxsize=4)
def _detokenizer(lang: str) -> Any:
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def from_entry(entry: Any, source: str = "checkpoint") -> TextForm:
    """The form a stored ``entry`` names (None or absent: raw). ``TextFormError`` naming ``source``
    for anything else."""
    if entry is None:
        return TextForm()
    if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) for k in ("name", "src_lang",
                                                                                          "tgt_lang")):
        raise TextFormError(f"{source}: {CHECKPOINT_KEY} must be a mapping of name, src_lang and tgt_lang, "
                            f"got {str(entry)[:80]}")
    try:
        return TextForm(entry["name"], entry["src_lang"], entry["tgt_lang"])
    except TextFormError as err:
        raise TextFormError(f"{source}: {err}") from None


def text_form_of(stored: Mapping[str, Any], source: str = "checkpoint") -> TextForm:
    """The form a model file (or ``data/tokens/stats.json``) was made with: its own entry, or in a
    training checkpoint the one the train stage's callback stored (under ``callbacks``)."""
    entry = stored.get(CHECKPOINT_KEY)
    if entry is None and isinstance(stored.get("callbacks"), Mapping):
        entry = stored["callbacks"].get(CHECKPOINT_KEY)
    return from_entry(entry, source)


def attach(tokenizer: Tokenizer, form: TextForm) -> Tokenizer:
    """``tokenizer`` preparing the source side in ``form`` and giving readers ``form``'s text."""
    if form.is_raw:
        tokenizer.preprocess = tokenizer.postprocess = None
    else:
        tokenizer.preprocess = functools.partial(form.prepare, lang=form.src_lang)
        tokenizer.postprocess = form.for_reader
    return tokenizer
