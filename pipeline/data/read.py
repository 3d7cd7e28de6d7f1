"""Reading a corpus's sides: plain text, gzip or WMT SGML, strict UTF-8, aligned into pairs."""

from __future__ import annotations

import gzip
import html
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.data.spec import DataError, Side

# Characters str.splitlines() breaks lines at, besides "\n": inside a sentence they would
# misalign any reader that splits lines that way, so they become spaces.
_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_SEG = re.compile(r"<seg\b[^>]*>(.*)</seg>", re.IGNORECASE)


def read_lines(path: Path, fmt: str, label: str) -> Iterator[str]:
    """Sentences of a text / gzip / SGM file, whitespace-stripped, strict UTF-8.

    Lines are split on ``\\n`` only. Raises ``DataError`` naming ``label`` and the line number
    for invalid UTF-8, and for an unreadable or truncated gzip stream.
    """
    opener: Any = gzip.open if fmt == "gz" else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(f"{label}: line {lineno} is not valid UTF-8 "
                                    f"({err.reason} at byte {err.start})") from None
                if fmt == "sgm":
                    match = _SEG.search(text)
                    if match is None:
                        continue
                    # SGML escapes the text (&amp; &quot; &lt; ...): sources and references must read
                    # the characters themselves. Whitespace runs become one space, as sacrebleu reads SGM.
                    text = " ".join(html.unescape(match.group(1)).split())
                yield _LINE_BREAKS.sub(" ", text).strip()
    except (OSError, EOFError) as err:
        raise DataError(f"{label}: cannot read after line {lineno}: {' '.join(str(err).split())}") from None


_END = object()


def read_pairs(src: tuple[Path, Side], tgt: tuple[Path, Side]) -> Iterator[tuple[str, str]]:
    """Aligned (source, target) sentences; ``DataError`` naming both files if the counts differ."""
    a = read_lines(src[0], src[1].fmt, src[1].label)
    b = read_lines(tgt[0], tgt[1].fmt, tgt[1].label)
    count = 0
    for x, y in itertools.zip_longest(a, b, fillvalue=_END):
        if x is _END or y is _END:
            rest = 1 + sum(1 for _ in (a if y is _END else b))
            na, nb = (count + rest, count) if y is _END else (count, count + rest)
            raise DataError(f"misaligned corpus: {src[1].label} has {na} lines but {tgt[1].label} has {nb}")
        count += 1
        yield x, y  # type: ignore[misc]
