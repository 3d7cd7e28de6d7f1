"""A WMT14 English-German mirror with synthetic text: the five statmt.org archives, WMT-shaped.

The output folder is laid out like the upstream base URL ``http://www.statmt.org/`` (so it can be
served, or named, as ``DATA_MIRROR``), with the archives and members fairseq's
``prepare-wmt14en2de.sh --icml17`` and the registry (``pipeline/data/wmt14.py``) read::

    wmt13/training-parallel-europarl-v7.tgz   training/europarl-v7.de-en.{de,en}
    wmt13/training-parallel-commoncrawl.tgz   commoncrawl.de-en.{de,en}
    wmt14/training-parallel-nc-v9.tgz         training/news-commentary-v9.de-en.{de,en}
    wmt14/dev.tgz                             dev/newstest2013.{de,en}
    wmt14/test-full.tgz                       test-full/newstest2014-deen-{src.en,ref.de}.sgm

The text is synthetic, but WMT-like in the ways that cost time and memory downstream:

- sentence lengths: log-normal, ~23 words a sentence on average, plus a long tail (a few lines
  per thousand of 150-600 words, as web-crawled data has);
- word frequencies: a Zipf-Mandelbrot distribution over ~100k types, so vocabularies, subword
  training and batching meet a realistic head and tail; German types include real compounds
  from the Multi30k mirror (``MULTI30K_DE``, read when present, synthetic ones otherwise);
- dirt for the cleaning to drop: empty lines on one or both sides and pairs whose length ratio is
  far off (a few per thousand, more in Common Crawl);
- non-ASCII: umlauts and ß, accents, curly punctuation, € and, rarely, CJK and emoji;
- the SGM test set: ``<srcset>``/``<refset>`` and ``<doc>`` headers as on statmt.org, one
  ``<seg id>`` a sentence (numbered per document), entities (``&amp; &lt; &gt;`` always,
  ``&quot; &apos;`` in every other document).

The German side is a noisy "translation" of the English one (a fixed word mapping, adjacent
words swapped, words dropped and German function words inserted), so a tiny model can learn it.

Generation streams: sentences are drawn in chunks with numpy (vectorised Zipf sampling; a chunk
is rendered by indexing tables of pre-formatted words and joining them once), written to
temporary member files and then added to the gzip'd tar, so memory stays bounded whatever the
size. Output is a function of (pairs, seed, dev, test, the Multi30k file): tar and gzip headers
carry fixed times and owners. Each archive is written to a temporary file and renamed.

    python -m tests.wmt14_fixture --pairs 4500000 --out /tmp/statmt [--seed 0] [--dev N] [--test N]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import os
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------- the archives


@dataclass(frozen=True)
class FixtureCorpus:
    """One corpus of the fixture: its name in the registry, its archive and members, its shape."""

    name: str                   # the registry's corpus name (pipeline/data/wmt14.py)
    archive: str                # path relative to the statmt.org base URL
    members: Mapping[str, str]  # language -> member path inside the archive
    fmt: str = "text"           # text | sgm
    share: float = 0.0          # WMT14 training pairs, millions (0: an evaluation set)
    median_words: float = 20.0  # of the log-normal sentence length
    sigma: float = 0.55         # log-normal spread
    long_rate: float = 0.0      # lines of 150-600 words, per line
    empty_rate: float = 0.0     # per line, for each of: en empty, de empty, both empty
    misaligned_rate: float = 0.0  # per line, for each side truncated to 1-2 words


CORPORA: tuple[FixtureCorpus, ...] = (
    FixtureCorpus("europarl-v7", "wmt13/training-parallel-europarl-v7.tgz",
                  {"en": "training/europarl-v7.de-en.en", "de": "training/europarl-v7.de-en.de"},
                  share=1.92, median_words=20.0, sigma=0.55, long_rate=5e-4, empty_rate=1e-3, misaligned_rate=1e-3),
    # Common Crawl is the noisy, web-crawled one: shorter and more varied lines, more dirt.
    FixtureCorpus("commoncrawl", "wmt13/training-parallel-commoncrawl.tgz",
                  {"en": "commoncrawl.de-en.en", "de": "commoncrawl.de-en.de"},
                  share=2.40, median_words=16.0, sigma=0.75, long_rate=1.5e-3, empty_rate=2e-3, misaligned_rate=3e-3),
    FixtureCorpus("news-commentary-v9", "wmt14/training-parallel-nc-v9.tgz",
                  {"en": "training/news-commentary-v9.de-en.en", "de": "training/news-commentary-v9.de-en.de"},
                  share=0.20, median_words=20.0, sigma=0.55, long_rate=3e-4, empty_rate=5e-4, misaligned_rate=5e-4),
    FixtureCorpus("newstest2013", "wmt14/dev.tgz", {"en": "dev/newstest2013.en", "de": "dev/newstest2013.de"},
                  median_words=19.0, sigma=0.5),
    FixtureCorpus("newstest2014", "wmt14/test-full.tgz",
                  {"en": "test-full/newstest2014-deen-src.en.sgm", "de": "test-full/newstest2014-deen-ref.de.sgm"},
                  fmt="sgm", median_words=19.0, sigma=0.5),
)
TRAIN_CORPORA = tuple(c for c in CORPORA if c.share > 0)
DEV_SENTENCES = 3000   # newstest2013
TEST_SENTENCES = 3003  # newstest2014 "full"

# The one table of archive members, to compare with the registry's ``DatasetSpec.members()``.
WMT14_EN_DE_MEMBERS: dict[str, frozenset[str]] = {c.archive: frozenset(c.members.values()) for c in CORPORA}

MULTI30K_DE = Path("/work/shared/data/multi30k/data/task1/raw/train.de.gz")

CHUNK_SENTENCES = 50_000   # part of the output's definition: draws happen chunk by chunk
VOCAB_SIZE = 100_000
_ZIPF_Q = 2.7                 # p(rank r) ~ 1 / (r + q), r = 1..V (Zipf-Mandelbrot, exponent 1)
_ARCHIVE_MTIME = 1393632000   # 2014-03-01: fixed, so the archives are byte-identical across runs
_GZIP_LEVEL = 1               # gzip -1: 3-4x faster than -6 on this text; readers don't care

# --------------------------------------------------------------------------- the vocabulary

# English types at the head of the Zipf ranks, with their German "translation" (many-to-one allowed).
_HEAD = [
    ("the", "die"), ("of", "von"), ("and", "und"), ("to", "zu"), ("a", "ein"), ("in", "in"), ("is", "ist"),
    ("that", "dass"), ("for", "für"), ("it", "es"), ("with", "mit"), ("as", "als"), ("was", "war"),
    ("on", "auf"), ("be", "sein"), ("by", "durch"), ("this", "diese"), ("are", "sind"), ("not", "nicht"),
    ("at", "bei"), ("from", "aus"), ("have", "haben"), ("we", "wir"), ("or", "oder"), ("an", "eine"),
    ("which", "welche"), ("but", "aber"), ("they", "sie"), ("has", "hat"), ("his", "seine"), ("will", "wird"),
    ("he", "er"), ("all", "alle"), ("more", "mehr"), ("their", "ihre"), ("been", "gewesen"), ("would", "würde"),
    ("there", "dort"), ("also", "auch"), ("can", "kann"), ("one", "eins"), ("about", "über"), ("new", "neue"),
    ("out", "heraus"), ("were", "waren"), ("I", "ich"), ("who", "wer"), ("its", "ihr"), ("so", "so"),
    ("should", "sollte"), ("these", "diese"), ("people", "Menschen"), ("if", "wenn"), ("our", "unser"),
    ("what", "was"), ("time", "Zeit"), ("year", "Jahr"), ("must", "muss"), ("very", "sehr"), ("Europe", "Europa"),
    ("only", "nur"), ("like", "wie"), ("after", "nach"), ("first", "erste"), ("two", "zwei"), ("than", "als"),
    ("other", "andere"), ("because", "weil"), ("it's", "gibt's"), ("years", "Jahre"), ("government", "Regierung"),
    ("country", "Land"), ("great", "groß"), ("Commission", "Kommission"), ("European", "europäische"),
    ("2014", "2014"), ("3.5", "3,5"), ("million", "Millionen"), ("President", "Präsident"), ("market", "Markt"),
    ("city", "Stadt"), ("street", "Straße"), ("white", "weiß"), ("man", "Mann"), ("women", "Frauen"),
    ("school", "Schule"), ("work", "Arbeit"), ("question", "Frage"), ("economic", "wirtschaftliche"),
    ("don't", "nicht"), ("world", "Welt"), ("Germany", "Deutschland"), ("10", "10"), ("1,000", "1.000"),
]
# Types placed at fixed ranks (overwriting synthetic ones): the characters SGML must escape,
# apostrophes, accents and, rarely, other scripts. Rank -> (en, de).
_PLACED = {
    150: ("&", "&"), 400: ("<", "<"), 900: (">", ">"), 1200: ("AT&T", "AT&T"), 700: ("Commission's", "Kommissions"),
    1500: ("€", "€"), 1800: ("–", "–"), 2500: ("café", "Café"), 3000: ("José", "José"), 3500: ("Müller", "Müller"),
    4000: ("“quoted”", "„zitiert“"), 5000: ("naïve", "naiv"), 6000: ("São", "São"), 7000: ("Zürich", "Zürich"),
    8000: ("Ærø", "Ærø"), 12000: ("東京", "Tokio"), 15000: ("北京", "Peking"), 20000: ("😀", "😀"),
    25000: ("Δ", "Δ"), 30000: ("한국", "Korea"), 40000: ("🙂", "🙂"),
}
# German-only function words the noisy "translation" inserts.
_DE_INSERTS = ["der", "die", "das", "den", "dem", "sich", "ja", "doch", "noch", "zu", "es", "auch"]
# Tokens the evaluation sets carry at a fixed stride, so that even a tiny test set has every
# character SGML escapes (the SGM writer also quotes whole sentences now and then).
_EVAL_SPECIALS = ["&", "<", "it's", ">", "AT&T", "don't"]

_EN_ONSETS = "b c d f g h j k l m n p r s t v w br ch cl cr dr fl gr pl pr sh sl sp st str th tr wh".split()
_EN_VOWELS = "a e i o u a e i o ai ea ee ou oo y".split()
_EN_CODAS = ["", "", "", "n", "r", "s", "t", "l", "nd", "nt", "ng", "ck", "st", "rt", "ss", "m"]
_EN_SUFFIXES = ["", "", "", "", "ing", "ed", "s", "tion", "ly", "er", "ment", "ness", "al"]
_DE_ONSETS = "b d f g h k l m n p r s t w z sch st sp pf kr gr br tr fr fl gl schw str".split()
_DE_VOWELS = "a e i o u a e i ä ö ü ei au eu ie".split()
_DE_CODAS = ["", "", "", "n", "r", "s", "t", "l", "ch", "cht", "ng", "nd", "ß", "tz", "ck", "rt", "lt", "m"]
_DE_SUFFIXES = ["", "", "", "en", "er", "ung", "heit", "keit", "lich", "ig", "isch", "chen", "e", "es"]
_ACCENTS = {"e": "é", "a": "à", "i": "ï", "o": "ô", "u": "ü", "n": "ñ", "c": "ç"}

_COMPOUND = re.compile(r"\b[A-ZÄÖÜ][a-zäöüß]+(?:-[A-ZÄÖÜa-zäöüß]+)*\b")


def multi30k_compounds(path: Path = MULTI30K_DE) -> list[str]:
    """Real German compounds (long nouns and hyphenated words) of Multi30k's training side, sorted;
    [] when the file is absent (the generator then makes synthetic ones)."""
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        words = set(_COMPOUND.findall(f.read()))
    return sorted(w for w in words if len(w) >= 11 or "-" in w)


def _synthetic_words(rng: np.random.Generator, count: int, onsets: list[str], vowels: list[str],
                     codas: list[str], suffixes: list[str], taken: set[str]) -> list[str]:
    """``count`` distinct pronounceable words not in ``taken`` (which grows), shorter ones first
    (frequent words are short). Vectorised over object arrays: 100k words take ~0.1 s."""
    syllables = np.array([o + v + c for o in onsets for v in vowels for c in codas], dtype=object)
    ends = np.array(suffixes, dtype=object)
    words: list[str] = []
    while len(words) < count:
        n = 2 * (count - len(words)) + 64
        # syllables grow with the position: 1 at the head, up to 4 in the tail
        rank = (len(words) + np.arange(n)) / count
        syl = 1 + np.minimum(3, (rng.random(n) * (1 + 3 * rank)).astype(int))
        parts = syllables[rng.integers(0, len(syllables), (4, n))]
        empty = np.full(n, "", dtype=object)
        drawn = parts[0] + np.where(syl > 1, parts[1], empty) + np.where(syl > 2, parts[2], empty) \
            + np.where(syl > 3, parts[3], empty) + ends[rng.integers(0, len(ends), n)]
        for w in drawn.tolist():
            if w not in taken:
                taken.add(w)
                words.append(w)
                if len(words) == count:
                    break
    return words


@dataclass
class Vocabulary:
    """Both languages' types, the en -> de mapping and the pre-formatted tables rendering uses.

    ``en`` and ``de`` are lists of types; ``en2de[i]`` is the German type of English type ``i``
    (Zipf rank ``i + 1``); German types from ``len(en)`` on are the inserted function words.
    """

    en: list[str]
    de: list[str]
    en2de: np.ndarray
    tables: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    @classmethod
    def build(cls, seed: int, size: int = VOCAB_SIZE, compounds: list[str] | None = None) -> Vocabulary:
        rng = np.random.default_rng([seed, 7919])
        compounds = multi30k_compounds() if compounds is None else compounds
        en = [e for e, _ in _HEAD]
        de_of = {e: d for e, d in _HEAD}
        taken_en = set(en) | {e for e, _ in _PLACED.values()}
        en += _synthetic_words(rng, size - len(en), _EN_ONSETS, _EN_VOWELS, _EN_CODAS, _EN_SUFFIXES, taken_en)
        taken_de = set(de_of.values()) | {d for _, d in _PLACED.values()} | set(_DE_INSERTS) | set(compounds)
        de_words = _synthetic_words(rng, size, _DE_ONSETS, _DE_VOWELS, _DE_CODAS, _DE_SUFFIXES, taken_de)
        if not compounds:   # no Multi30k: compounds of two synthetic stems, some hyphenated
            a, b = rng.integers(0, size, (2, 3000))
            compounds = sorted({f"{de_words[i].capitalize()}{'-' if i % 7 == 0 else ''}{de_words[j]}"
                                for i, j in zip(a.tolist(), b.tolist())} - taken_de)
        # A few accented English types (loanwords, names); nouns capitalised in German.
        for i in range(len(_HEAD), size):
            if i % 97 == 0:
                w = en[i]
                for plain, accented in _ACCENTS.items():
                    if plain in w:
                        w = w.replace(plain, accented, 1)
                        break
                if w not in taken_en:
                    taken_en.add(w)
                    en[i] = w
        de = []
        synth = iter(de_words)
        for i in range(size):
            w = de_of.get(en[i]) if i < len(_HEAD) else None
            de.append(w if w is not None else next(synth))
        de = [w.capitalize() if i >= len(_HEAD) and i % 3 == 0 else w for i, w in enumerate(de)]
        # Real compounds are rare words: spread over the ranks from 2000 on.
        start = 2000
        step = max(1, (size - start) // max(1, len(compounds)))
        for k, w in enumerate(compounds):
            rank = start + k * step
            if rank >= size:
                break
            de[rank] = w
        for rank, (e, d) in _PLACED.items():
            if rank < size:
                en[rank], de[rank] = e, d
        en2de = np.arange(size, dtype=np.int64)
        de += _DE_INSERTS
        vocab = cls(en=en, de=de, en2de=en2de)
        vocab.tables = {"en": _tables(en), "de": _tables(de)}
        return vocab

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` English type ids (rank - 1) drawn from the Zipf-Mandelbrot law p(r) ~ 1 / (r + q).

        Inverse-CDF sampling of the density 1 / (x + q) on [0.5, V + 0.5], rounded to the nearest
        rank: p(r) = ln((r + q + 0.5) / (r + q - 0.5)) / Z, within 0.6% of 1 / ((r + q) Z) at rank 1
        and closer after, and ~7x faster than a binary search in the discrete CDF.
        """
        lo, hi = 0.5 + _ZIPF_Q, len(self.en) + 0.5 + _ZIPF_Q
        x = lo * (hi / lo) ** rng.random(n) - _ZIPF_Q
        return (np.rint(x).astype(np.int64) - 1).clip(0, len(self.en) - 1)


# Rendering kinds: a token is written as its type plus what follows it (space, comma, end of line),
# capitalised at the start of a sentence, quoted when the sentence is.
_MID, _COMMA, _FIRST, _FIRST_Q, _LAST, _LAST_QM, _LAST_Q, _SINGLE = range(8)


def _cap(w: str) -> str:
    return w[:1].upper() + w[1:]


def _tables(words: list[str]) -> np.ndarray:
    """Object array (8 * V,): the type of each id as each rendering kind writes it."""
    w = np.array(words, dtype=object)
    c = np.array([_cap(x) for x in words], dtype=object)
    # in the order of the kinds _MID .. _SINGLE
    return np.concatenate([w + " ", w + ", ", c + " ", '"' + c + " ", w + ".\n", w + "?\n", w + '."\n', c + ".\n"])


def _render(sid: np.ndarray, ids: np.ndarray, n: int, table: np.ndarray, types: int,
            quoted: np.ndarray, question: np.ndarray, comma: np.ndarray) -> str:
    """``n`` lines of text ("\\n"-terminated) from tokens (sentence id, type id), ``sid`` sorted.

    A sentence without tokens is an empty line.
    """
    if len(ids) == 0:
        return "\n" * n
    first = np.ones(len(sid), dtype=bool)
    first[1:] = sid[1:] != sid[:-1]
    last = np.ones(len(sid), dtype=bool)
    last[:-1] = first[1:]
    kind = np.where(comma, _COMMA, _MID)
    kind[first] = np.where(quoted, _FIRST_Q, _FIRST)[sid[first]]
    kind[last] = np.where(quoted, _LAST_Q, np.where(question, _LAST_QM, _LAST))[sid[last]]
    kind[first & last] = _SINGLE
    pieces = table[kind * types + ids]
    counts = np.bincount(sid, minlength=n)
    empty = np.flatnonzero(counts == 0)
    if len(empty):
        offsets = np.cumsum(counts) - counts
        pieces = np.insert(pieces, offsets[empty], "\n")
    return "".join(pieces.tolist())


def _positions(sid: np.ndarray, n: int) -> np.ndarray:
    """Position of each token inside its sentence (``sid`` sorted)."""
    counts = np.bincount(sid, minlength=n)
    starts = np.cumsum(counts) - counts
    return np.arange(len(sid)) - starts[sid]


def _chunk(vocab: Vocabulary, corpus: FixtureCorpus, n: int, rng: np.random.Generator,
           specials: bool, offset: int) -> tuple[str, str]:
    """``n`` aligned lines of English and German text (each "\\n"-terminated)."""
    lengths = np.maximum(1, np.rint(rng.lognormal(np.log(corpus.median_words), corpus.sigma, n))).astype(np.int64)
    if corpus.long_rate:
        long = rng.random(n) < corpus.long_rate
        lengths[long] = rng.integers(150, 601, int(long.sum()))
    sid = np.repeat(np.arange(n), lengths)
    en = vocab.sample(rng, len(sid))
    starts = np.cumsum(lengths) - lengths
    if specials:   # every 20th sentence of an evaluation set starts with a character SGML escapes
        at = np.arange((-offset) % 20, n, 20)
        special_ids = np.array([vocab.en.index(w) for w in _EVAL_SPECIALS])
        en[starts[at]] = special_ids[((offset + at) // 20) % len(_EVAL_SPECIALS)]

    # German: the mapped types, adjacent words swapped, some dropped, function words inserted.
    de = vocab.en2de[en]
    same_next = np.zeros(len(sid), dtype=bool)
    same_next[:-1] = sid[1:] == sid[:-1]
    swap = (rng.random(len(sid)) < 0.10) & same_next
    swap[1:] &= ~swap[:-1]            # no overlapping swaps
    at = np.flatnonzero(swap)
    de[at], de[at + 1] = de[at + 1], de[at].copy()
    keep = rng.random(len(sid)) >= 0.03
    keep[starts] = True               # a sentence keeps at least one word
    de, de_sid = de[keep], sid[keep]
    n_ins = rng.binomial(len(de), 0.06)
    where = np.sort(rng.integers(0, len(de), n_ins))
    de = np.insert(de, where, len(vocab.en) + rng.integers(0, len(_DE_INSERTS), n_ins))
    de_sid = np.insert(de_sid, where, de_sid[where])

    # Dirt: empty sides, and sides cut to 1-2 words (length ratios the cleaning drops).
    en_keep = np.ones(len(en), dtype=bool)
    de_keep = np.ones(len(de), dtype=bool)
    if corpus.empty_rate or corpus.misaligned_rate:
        u = rng.random(n)
        r = corpus.empty_rate
        en_empty = u < 2 * r                        # en only, then both
        de_empty = (u >= r) & (u < 3 * r)           # both, then de only
        m = corpus.misaligned_rate
        en_cut = (u >= 3 * r) & (u < 3 * r + m)
        de_cut = (u >= 3 * r + m) & (u < 3 * r + 2 * m)
        cut_to = rng.integers(1, 3, n)
        en_keep &= ~en_empty[sid] & ~(en_cut[sid] & (_positions(sid, n) >= cut_to[sid]))
        de_keep &= ~de_empty[de_sid] & ~(de_cut[de_sid] & (_positions(de_sid, n) >= cut_to[de_sid]))

    quoted = rng.random(n) < 0.04
    question = rng.random(n) < 0.05
    if specials:
        quoted[np.arange((10 - offset) % 20, n, 20)] = True
    en_text = _render(sid[en_keep], en[en_keep], n, vocab.tables["en"], len(vocab.en),
                      quoted, question, (rng.random(len(en)) < 0.05)[en_keep])
    de_text = _render(de_sid[de_keep], de[de_keep], n, vocab.tables["de"], len(vocab.de),
                      quoted, question, (rng.random(len(de)) < 0.06)[de_keep])
    return en_text, de_text


def _lines(vocab: Vocabulary, corpus: FixtureCorpus, count: int, seed: int) -> Iterator[tuple[str, str]]:
    """The corpus's text, chunk by chunk: (en, de) blocks of aligned "\\n"-terminated lines."""
    index = CORPORA.index(corpus)
    rng = np.random.default_rng([seed, index])
    specials = corpus.share == 0
    for start in range(0, count, CHUNK_SENTENCES):
        yield _chunk(vocab, corpus, min(CHUNK_SENTENCES, count - start), rng, specials, start)


# --------------------------------------------------------------------------- SGM

_SOURCES = ["bbc", "dw", "cnn", "guardian", "spiegel", "welt", "nytimes", "independent", "faz", "sueddeutsche"]


def _sgm_escape(text: str, quotes: bool) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if quotes:
        text = text.replace('"', "&quot;").replace("'", "&apos;")
    return text


def _write_sgm(vocab: Vocabulary, corpus: FixtureCorpus, count: int, seed: int, en_path: Path, de_path: Path) -> None:
    """newstest2014 as statmt.org ships it: the English source and the German reference, in documents."""
    en_lines: list[str] = []
    de_lines: list[str] = []
    for en, de in _lines(vocab, corpus, count, seed):
        en_lines += en.split("\n")[:-1]
        de_lines += de.split("\n")[:-1]
    rng = np.random.default_rng([seed, 4243])
    sizes: list[int] = []
    while sum(sizes) < count:
        sizes.append(int(rng.integers(5, 41)))
    sizes[-1] -= sum(sizes) - count
    heads = {"en": '<srcset setid="newstest2014" srclang="any">\n',
             "de": '<refset setid="newstest2014" srclang="any" trglang="de">\n'}
    tails = {"en": "</srcset>\n", "de": "</refset>\n"}
    for lang, lines, path in (("en", en_lines, en_path), ("de", de_lines, de_path)):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(heads[lang])
            i = 0
            for d, size in enumerate(sizes):
                origlang = "de" if d % 3 == 1 else "en"
                f.write(f'<doc sysid="ref" docid="{1012 + d}-{_SOURCES[d % len(_SOURCES)]}" genre="news" '
                        f'origlang="{origlang}">\n')
                for k in range(size):
                    f.write(f'<seg id="{k + 1}">{_sgm_escape(lines[i], quotes=d % 2 == 1)}</seg>\n')
                    i += 1
                f.write("</doc>\n")
            f.write(tails[lang])


# --------------------------------------------------------------------------- archives


def _write_text(vocab: Vocabulary, corpus: FixtureCorpus, count: int, seed: int, en_path: Path, de_path: Path) -> None:
    with open(en_path, "wb", buffering=1 << 22) as fe, open(de_path, "wb", buffering=1 << 22) as fd:
        for en, de in _lines(vocab, corpus, count, seed):
            fe.write(en.encode("utf-8"))
            fd.write(de.encode("utf-8"))


def _write_tgz(dest: Path, members: list[tuple[str, Path]]) -> None:
    """A gzip'd tar of ``members`` (name, file), with directory entries, fixed times and owners."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_GZIP_LEVEL, mtime=0) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                    dirs = sorted({str(Path(name).parent) for name, _ in members} - {"."})
                    for d in dirs:
                        info = tarfile.TarInfo(d)
                        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _ARCHIVE_MTIME
                        tar.addfile(info)
                    for name, path in members:
                        info = tarfile.TarInfo(name)
                        info.size, info.mode, info.mtime = path.stat().st_size, 0o644, _ARCHIVE_MTIME
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@functools.lru_cache(maxsize=2)
def _vocabulary(seed: int, compounds: tuple[str, ...] | None) -> Vocabulary:
    """``Vocabulary.build``, kept for the next call: tests generate several fixtures per process."""
    return Vocabulary.build(seed, compounds=None if compounds is None else list(compounds))


def split_pairs(pairs: int) -> dict[str, int]:
    """Training pairs per corpus, in WMT14's proportions (europarl 1.92M : commoncrawl 2.40M :
    news-commentary 0.20M); every corpus gets at least one pair when ``pairs >= 3``."""
    total = sum(c.share for c in TRAIN_CORPORA)
    counts = {c.name: int(round(pairs * c.share / total)) for c in TRAIN_CORPORA}
    if pairs >= len(TRAIN_CORPORA):
        for c in TRAIN_CORPORA:
            counts[c.name] = max(1, counts[c.name])
    largest = max(counts, key=counts.__getitem__)
    counts[largest] += pairs - sum(counts.values())
    return counts


@dataclass(frozen=True)
class Wmt14Fixture:
    """What ``generate`` wrote: the mirror's root, the archives, sentence pairs per corpus."""

    root: Path
    archives: dict[str, Path]   # relative path (as in WMT14_EN_DE_MEMBERS) -> file
    pairs: dict[str, int]       # corpus name -> pairs (training corpora, newstest2013, newstest2014)
    seconds: float


def generate(out: Path, pairs: int, seed: int = 0, dev: int | None = None, test: int | None = None,
             compounds: list[str] | None = None) -> Wmt14Fixture:
    """Write the five archives under ``out`` (a statmt.org-shaped mirror); see the module docstring.

    Args:
        pairs: training pairs in all (split by ``split_pairs``).
        dev, test: newstest2013 / newstest2014 sentences; default ``min(3000, pairs)`` and
            ``min(3003, pairs)`` (at least 1).
        compounds: German compounds to mix in; default those of ``MULTI30K_DE`` when present.
    """
    if pairs < 1:
        raise ValueError(f"pairs must be positive, got {pairs}")
    dev = max(1, min(DEV_SENTENCES, pairs)) if dev is None else dev
    test = max(1, min(TEST_SENTENCES, pairs)) if test is None else test
    if dev < 1 or test < 1:
        raise ValueError(f"dev and test need at least one sentence, got dev={dev} test={test}")
    start = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = _vocabulary(seed, None if compounds is None else tuple(compounds))
    counts = {**split_pairs(pairs), "newstest2013": dev, "newstest2014": test}
    archives: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix=".wmt14_fixture.", dir=out) as tmpdir:
        for corpus in CORPORA:
            en_path, de_path = Path(tmpdir) / "en", Path(tmpdir) / "de"
            write = _write_sgm if corpus.fmt == "sgm" else _write_text
            write(vocab, corpus, counts[corpus.name], seed, en_path, de_path)
            # members in name order (de before en), as tar lists a folder
            members = sorted([(corpus.members["en"], en_path), (corpus.members["de"], de_path)])
            archives[corpus.archive] = out / corpus.archive
            _write_tgz(archives[corpus.archive], members)
    return Wmt14Fixture(out, archives, counts, time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.wmt14_fixture", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, required=True, help="training pairs in all")
    parser.add_argument("--out", type=Path, required=True, help="the mirror's root folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dev", type=int, default=None,
                        help=f"newstest2013 sentences (default min({DEV_SENTENCES}, pairs))")
    parser.add_argument("--test", type=int, default=None,
                        help=f"newstest2014 sentences (default min({TEST_SENTENCES}, pairs))")
    args = parser.parse_args(argv)
    try:
        fixture = generate(args.out, args.pairs, args.seed, args.dev, args.test)
    except ValueError as err:
        parser.error(str(err))
    size = sum(p.stat().st_size for p in fixture.archives.values())
    print(f"{args.out}: {args.pairs:,} training pairs "
          f"({', '.join(f'{k} {v:,}' for k, v in fixture.pairs.items())}), "
          f"{size / 1e6:.1f} MB of archives in {fixture.seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
