"""Text in a model's form (``tokenizer.text_form``, named in ``pipeline.text.names``).

- ``raw``: the corpus as published, cased and detokenized; what the default recipe trains on
  (§5.1: byte-pair encoding of the sentences themselves).
- ``lc_norm_tok``: the Multi30k literature's form (Wu et al. 2021 among others): every training
  sentence, both sides, put through upstream's ``lowercase.perl | normalize-punctuation.perl |
  tokenizer.perl`` (``pipeline.text.moses.lc_norm_tok``, the very function that makes hypotheses
  comparable with the ``lc.norm.tok`` references) before SentencePiece learns its pieces. A model of
  this form writes that form itself: its hypotheses are scored against the references as they are
  (never put through the tokenizer a second time, which would split and escape ``&apos;`` into
  ``&amp; apos ;``), and a reader gets them detokenized (``MosesDetokenizer``, which unescapes).

A model file names its form (``pipeline.text.names.text_form_of``); whoever loads one (tune, evaluate,
translate, the pyfunc model, the server, the gate) attaches it to the model's tokenizer (``attach``),
which then prepares what it encodes and gives readers text as they read it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.text.names import TextForm
from transformer.tokenizer import Tokenizer

CHUNK_LINES = 10_000           # lines prepared at a time: a corpus is streamed, never held whole


def prepare(form: TextForm, lines: list[str], lang: str) -> list[str]:
    """``lines`` of language ``lang`` in ``form``."""
    if form.is_raw:
        return lines
    from pipeline.text.moses import lc_norm_tok

    return lc_norm_tok(lines, lang)


def stream(form: TextForm, lines: Iterable[str], lang: str) -> Iterator[str]:
    """``prepare`` over a stream, ``CHUNK_LINES`` at a time."""
    if form.is_raw:
        yield from lines
        return
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == CHUNK_LINES:
            yield from prepare(form, chunk, lang)
            chunk = []
    if chunk:
        yield from prepare(form, chunk, lang)


def for_reader(form: TextForm, lines: list[str]) -> list[str]:
    """Target-side text of ``form`` as a reader gets it: detokenized and unescaped (still lowercase)."""
    if form.is_raw:
        return lines
    detokenizer = _detokenizer(form.tgt_lang)
    return [detokenizer.detokenize(line.split(), unescape=True) for line in lines]


@functools.lru_cache(maxsize=4)
def _detokenizer(lang: str) -> Any:
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


def attach(tokenizer: Tokenizer, form: TextForm) -> Tokenizer:
    """``tokenizer`` preparing what it encodes in ``form`` *for the source language* (a model encodes
    sources only; target text is prepared with ``prepare(form, lines, form.tgt_lang)``) and giving
    readers ``form``'s output detokenized."""
    if form.is_raw:
        tokenizer.preprocess = tokenizer.postprocess = None
    else:
        tokenizer.preprocess = functools.partial(prepare, form, lang=form.src_lang)
        tokenizer.postprocess = functools.partial(for_reader, form)
    return tokenizer
