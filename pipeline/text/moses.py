"""The Moses scripts the Multi30k literature runs on text, via sacremoses: upstream's
``scripts/task1-tokenize.sh`` (``lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l
lang``, ``lc_norm_tok``) and ``tokenizer.perl`` alone (``moses_tokenize``). What makes the literature's
references, what its scores put hypotheses through (``pipeline.scoring``), and what a model of the
literature's text form trains on (``pipeline.text.forms``): one implementation for all three.

Here: Python's ``str.lower`` for ``lowercase.perl`` (Perl's ``lc`` under ``:utf8``), sacremoses'
``MosesPunctNormalizer`` with ``perl_parity`` (``’`` -> ``"``, as the Moses scripts upstream ran) on the
line *with* its newline (Perl reads lines with it, and the rule that moves a sentence-final period out of
a closing quote, ``s/(\\.+)\\"(\\s*[^<])/\\"$1$2/``, matches the newline as its last character), then
``tokenizer.perl``'s defaults (escaping on, no ``-a``). On the raw val and test_2016_flickr references
in English, German and French this equals upstream's ``lc.norm.tok`` files line for line
(tests/pipeline/scoring/test_literature_bleu.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from sacremoses import MosesPunctNormalizer, MosesTokenizer


@functools.lru_cache(maxsize=8)
def _tokenizer(lang: str) -> MosesTokenizer:
    """One tokenizer per language: building one reads the nonbreaking-prefix lists."""
    return MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=8)
def _normalizer(lang: str) -> MosesPunctNormalizer:
    return MosesPunctNormalizer(lang=lang, perl_parity=True)


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
    """``tokenizer.perl -l lang`` (no options) on each line: punctuation split off, hyphenated
    words kept whole, XML special characters escaped."""
    tok = _tokenizer(lang)
    return [tok.tokenize(line, aggressive_dash_splits=False, return_str=True, escape=True) for line in lines]


def lc_norm_tok(lines: Iterable[str], lang: str) -> list[str]:
    """``lowercase.perl | normalize-punctuation.perl -l lang | tokenizer.perl -l lang`` on each line
    (upstream's task1-tokenize.sh)."""
    normalizer = _normalizer(lang)
    # The newline: Perl's <STDIN> keeps it, and one normalization rule needs it (module docstring);
    # sacremoses strips the line it returns.
    normalized = [normalizer.normalize(line.lower() + "\n") for line in lines]
    return moses_tokenize(normalized, lang)
