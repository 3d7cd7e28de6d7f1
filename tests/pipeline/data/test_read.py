"""pipeline/data/read.py: WMT SGML segments are read as text (entities unescaped, whitespace
collapsed), plain and gzip lines split on newlines only."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from pipeline.data.read import read_lines, read_pairs
from pipeline.data.spec import DataError, RemoteFile, Side

pytestmark = pytest.mark.fast

SGM = """<refset setid="newstest2014" srclang="any" trglang="de">
<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">
<p>
<seg id="1">Gollum &amp; Sméagol sagten: &quot;Mein Schatz&quot;.</seg>
<seg id="2">  a   &lt;tag&gt;  with &apos;spaces&apos;  </seg>
<seg id="3">Fisch &#38; Chips &#x2013; 3 &euro;</seg>
</p>
</doc>
</refset>
"""


def test_sgml_entities_are_unescaped_and_spaces_collapsed(tmp_path: Path):
    path = tmp_path / "newstest2014-deen-ref.de.sgm"
    path.write_text(SGM, encoding="utf-8")
    assert list(read_lines(path, "sgm", path.name)) == [
        'Gollum & Sméagol sagten: "Mein Schatz".',
        "a <tag> with 'spaces'",
        "Fisch & Chips \u2013 3 \u20ac",
    ]


def test_plain_text_keeps_entities_and_splits_on_newline_only(tmp_path: Path):
    path = tmp_path / "train.en.gz"
    path.write_bytes(gzip.compress("a &amp; b\nc\u2028d\n".encode("utf-8")))
    assert list(read_lines(path, "gz", path.name)) == ["a &amp; b", "c d"]


def test_pairs_of_different_lengths_name_both_sides(tmp_path: Path):
    a, b = tmp_path / "x.en", tmp_path / "x.de"
    a.write_text("1\n2\n3\n", encoding="utf-8")
    b.write_text("1\n2\n", encoding="utf-8")
    sides = ((a, Side(RemoteFile("x.en"))), (b, Side(RemoteFile("x.de"))))
    with pytest.raises(DataError, match="misaligned corpus: x.en has 3 lines but x.de has 2"):
        list(read_pairs(*sides))
