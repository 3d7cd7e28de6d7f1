"""The WMT14-shaped fixture (tests/wmt14_fixture.py): archive layout against the registry, SGM,
sizes, the shape of the text (lengths, dirt, non-ASCII, a learnable mapping), determinism, and
the real download stage's reading and cleaning of it."""

from __future__ import annotations

import hashlib
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import wmt14_fixture as fx

pytestmark = pytest.mark.fast

try:   # the registry moved from pipeline/datasets.py into the pipeline.data package
    from pipeline.data.registry import REGISTRY
except ImportError:  # pragma: no cover - the layout before the move
    from pipeline.datasets import REGISTRY  # type: ignore[no-redef]

PAIRS = 20_000   # large enough for a dozen 150-600-word lines, generated in ~2 s


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> fx.Wmt14Fixture:
    return fx.generate(tmp_path_factory.mktemp("statmt"), PAIRS, seed=0)


def read_members(archive: Path) -> dict[str, bytes]:
    """Regular-file members of a tar archive, by name."""
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def lines(data: bytes) -> list[str]:
    text = data.decode("utf-8")
    assert text.endswith("\n")
    return text[:-1].split("\n")


def test_member_table_matches_the_registry():
    spec = REGISTRY["wmt14_en_de"]
    assert spec.members() == {archive: set(members) for archive, members in fx.WMT14_EN_DE_MEMBERS.items()}
    by_name = {c.name: c for c in fx.CORPORA}
    for corpora in spec.splits.values():
        for corpus in corpora:
            mine = by_name[corpus.name]
            for lang, side in corpus.sides.items():
                assert (side.file.path, side.member, side.fmt) == (mine.archive, mine.members[lang], mine.fmt)
    assert {c.name for cs in spec.splits.values() for c in cs} == set(by_name)


def test_archives_and_members_are_statmt_s(mirror):
    files = sorted(p.relative_to(mirror.root).as_posix() for p in mirror.root.rglob("*") if p.is_file())
    assert files == sorted([
        "wmt13/training-parallel-europarl-v7.tgz", "wmt13/training-parallel-commoncrawl.tgz",
        "wmt14/training-parallel-nc-v9.tgz", "wmt14/dev.tgz", "wmt14/test-full.tgz"])
    expected = {
        "wmt13/training-parallel-europarl-v7.tgz": {"training/europarl-v7.de-en.de", "training/europarl-v7.de-en.en"},
        "wmt13/training-parallel-commoncrawl.tgz": {"commoncrawl.de-en.de", "commoncrawl.de-en.en"},
        "wmt14/training-parallel-nc-v9.tgz": {"training/news-commentary-v9.de-en.de",
                                              "training/news-commentary-v9.de-en.en"},
        "wmt14/dev.tgz": {"dev/newstest2013.de", "dev/newstest2013.en"},
        "wmt14/test-full.tgz": {"test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm"},
    }
    for archive, members in expected.items():
        assert set(read_members(mirror.root / archive)) == members
        assert mirror.archives[archive] == mirror.root / archive


def test_pairs_per_corpus_add_up(mirror):
    assert fx.split_pairs(4_520_000) == {"europarl-v7": 1_920_000, "commoncrawl": 2_400_000,
                                         "news-commentary-v9": 200_000}
    assert sum(fx.split_pairs(7).values()) == 7 and min(fx.split_pairs(7).values()) >= 1
    counts = {}
    for corpus in fx.TRAIN_CORPORA + (fx.CORPORA[3],):
        data = read_members(mirror.root / corpus.archive)
        en, de = lines(data[corpus.members["en"]]), lines(data[corpus.members["de"]])
        assert len(en) == len(de)
        counts[corpus.name] = len(en)
    assert counts == {"europarl-v7": 8496, "commoncrawl": 10619, "news-commentary-v9": 885, "newstest2013": 3000}
    assert sum(counts[c.name] for c in fx.TRAIN_CORPORA) == PAIRS
    assert {k: v for k, v in mirror.pairs.items() if k != "newstest2014"} == counts


def test_sgm_one_seg_per_sentence_same_count_both_sides(mirror):
    data = read_members(mirror.root / "wmt14/test-full.tgz")
    src = data["test-full/newstest2014-deen-src.en.sgm"].decode("utf-8")
    ref = data["test-full/newstest2014-deen-ref.de.sgm"].decode("utf-8")
    assert src.startswith('<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1012-bbc" ')
    assert ref.startswith('<refset setid="newstest2014" srclang="any" trglang="de">\n<doc ')
    segs = {}
    for lang, text, root_tag in (("en", src, "srcset"), ("de", ref, "refset")):
        root = ET.fromstring(text)   # well-formed: every & < > escaped
        assert root.tag == root_tag
        docs = root.findall("doc")
        assert len(docs) > 50
        for doc in docs:   # seg ids count from 1 in every document, as on statmt.org
            assert [s.get("id") for s in doc.findall("seg")] == [str(i) for i in range(1, len(doc) + 1)]
        segs[lang] = [s.text for s in root.iter("seg")]
        assert all(segs[lang])
        assert text.count("<seg id=") == len(segs[lang]) == fx.TEST_SENTENCES == mirror.pairs["newstest2014"]
    for entity in ("&amp;", "&quot;", "&lt;", "&gt;", "&apos;"):
        assert entity in src and entity in ref
    # the characters themselves, read back: the reader of the download stage gives the same text
    from pipeline.data.read import read_lines
    path = mirror.root.parent / "ref.sgm"
    path.write_text(ref, encoding="utf-8")
    assert list(read_lines(path, "sgm", "ref")) == segs["de"]
    assert any("&" in s for s in segs["en"]) and any('"' in s for s in segs["de"])


def test_text_is_wmt_shaped(mirror):
    en, de = [], []
    for corpus in fx.TRAIN_CORPORA:
        data = read_members(mirror.root / corpus.archive)
        en += lines(data[corpus.members["en"]])
        de += lines(data[corpus.members["de"]])
    en_len = [len(s.split()) for s in en]
    de_len = [len(s.split()) for s in de]
    assert 18 <= sum(en_len) / len(en) <= 28 and 18 <= sum(de_len) / len(de) <= 28
    assert sum(n > 200 for n in en_len) >= 5       # the long tail (~0.1%)
    assert max(en_len) > 400
    empty = sum(a == 0 or b == 0 for a, b in zip(en_len, de_len))
    misaligned = sum(a > 0 and b > 0 and max(a / b, b / a) > 3 for a, b in zip(en_len, de_len))
    assert 2 <= 1000 * empty / PAIRS <= 15 and 1 <= 1000 * misaligned / PAIRS <= 10   # a few per thousand
    text = "".join(en + de)
    assert {"ä", "ö", "ü", "ß", "é", "€"} <= set(text)
    assert any(ord(c) > 0x2FFF for c in text)        # CJK or emoji, rarely
    # Zipf: the head type is ~2.6% of the tokens, and most of the 100k types occur
    words = " ".join(en).split()
    assert 0.02 < words.count("the") / len(words) < 0.035
    assert len(set(words)) > 50_000
    # German compounds: Multi30k's real ones when the mirror is there, synthetic ones otherwise
    german = set(" ".join(de).split())
    compounds = fx.multi30k_compounds()
    if compounds:
        assert len(german & set(compounds)) > 1000
    assert sum("-" in w and w[0].isupper() for w in german) > 100


def test_german_is_a_learnable_translation(mirror):
    data = read_members(mirror.root / "wmt14/dev.tgz")
    en, de = lines(data["dev/newstest2013.en"]), lines(data["dev/newstest2013.de"])
    with_the = [(" die " in f" {d.lower()} ") for e, d in zip(en, de) if " the " in f" {e} "]
    assert len(with_the) > 1000 and sum(with_the) / len(with_the) > 0.9
    ratio = sum(len(d.split()) for d in de) / sum(len(e.split()) for e in en)
    assert 1.0 < ratio < 1.06   # 6% inserted, 3% dropped


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    def digests(root: Path) -> dict[str, str]:
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*.tgz"))}

    fx.generate(tmp_path / "a", 300, seed=0)
    fx._vocabulary.cache_clear()   # rebuild the vocabulary too
    fx.generate(tmp_path / "b", 300, seed=0)
    fx.generate(tmp_path / "c", 300, seed=1)
    a, b, c = digests(tmp_path / "a"), digests(tmp_path / "b"), digests(tmp_path / "c")
    assert len(a) == 5 and a == b
    assert all(a[k] != c[k] for k in a)


def test_small_sizes_and_overrides(tmp_path, capsys):
    assert fx.main(["--pairs", "5", "--out", str(tmp_path), "--seed", "1", "--test", "7"]) == 0
    assert "5 training pairs" in capsys.readouterr().out
    dev = read_members(tmp_path / "wmt14/dev.tgz")
    assert len(lines(dev["dev/newstest2013.en"])) == 5            # min(3000, pairs)
    test = read_members(tmp_path / "wmt14/test-full.tgz")
    assert test["test-full/newstest2014-deen-src.en.sgm"].count(b"<seg id=") == 7
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]   # no temporary left behind
    with pytest.raises(ValueError, match="pairs must be positive"):
        fx.generate(tmp_path, 0)


def test_the_download_stage_reads_and_cleans_it(mirror, tmp_path, monkeypatch):
    """Served as DATA_MIRROR, the fixture goes through the real fetch, extraction, reading and
    cleaning: every pair counted, the dirt dropped, the 3003 SGM segments read."""
    from pipeline.config.params import DataParams
    from pipeline.data import checksums
    from pipeline.data.corpus import prepare_corpus

    monkeypatch.delenv("DATA_MIRROR", raising=False)
    monkeypatch.setattr(checksums, "CHECKSUMS_FILE", tmp_path / "checksums.json")
    data = DataParams(dataset="wmt14_en_de", mirror=str(mirror.root), valid_set="newstest2013",
                      test_sets=["newstest2014"], incoming_dir="", max_ratio=3.0)
    stats = prepare_corpus(data, tmp_path / "corpus", tmp_path / "cache", checksums_file=tmp_path / "checksums.json",
                           retries=0, progress=False)
    train = stats["splits"]["train"]
    assert train["raw"] == PAIRS
    assert train["dropped"]["empty"] > 0 and train["dropped"]["ratio"] > 0 and train["dropped"]["too_long"] > 0
    assert stats["splits"]["newstest2014"]["kept"] == 3003
    assert stats["splits"]["newstest2013"]["kept"] == 3000
    ref = (tmp_path / "corpus" / "newstest2014.de").read_text(encoding="utf-8")
    assert "&amp;" not in ref and "&" in ref   # entities read as the characters
