"""The literature's tokenized references (pipeline/data/references.py, fetch_references.py, the
references stage): which files exist, fetched and verified like the raw files, written with a manifest,
read back by tune and evaluate; none for WMT14."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipeline.config.data import DataParams
from pipeline.data import references
from pipeline.data.fetch_references import write_references
from pipeline.data.spec import DataError

pytestmark = pytest.mark.fast

MIRROR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "multi30k"
needs_mirror = pytest.mark.skipif(not (MIRROR / "data/task1/tok").is_dir(),
                                  reason=f"the Multi30k mirror is not at {MIRROR}")
TOK = "data/task1/tok"


def test_which_sets_have_references():
    file = references.reference_file("multi30k", "test_2016_flickr", "de")
    assert file.path == f"{TOK}/test_2016_flickr.lc.norm.tok.de"
    assert file.sha256 == "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4"   # published
    assert references.reference_file("multi30k", "test_2017_flickr", "fr").sha256 is None   # trust on first use
    for dataset, split, lang in (("multi30k", "test_2018_flickr", "de"), ("multi30k", "val", "cs"),
                                 ("wmt14_en_de", "newstest2014", "de")):
        assert references.reference_file(dataset, split, lang) is None
    # every published hash belongs to a file the registry names
    named = {f"{split}.lc.norm.tok.{lang}" for split, langs in references.MULTI30K_TOK_SPLITS.items() for lang in langs}
    assert set(references.MULTI30K_TOK_SHA256) <= named and len(references.MULTI30K_TOK_SHA256) == 6


@needs_mirror
def test_fetched_verified_and_written_with_a_manifest(tmp_path):
    out = tmp_path / "data/references"
    manifest = write_references(DataParams(mirror=str(MIRROR)), out, tmp_path / "cache")
    assert manifest["dataset"] == "multi30k" and manifest["tgt_lang"] == "de" and list(manifest["sets"]) == [
        "val", "test_2016_flickr"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test_2016_flickr.de", "val.de"]
    for split, lines in (("val", 1014), ("test_2016_flickr", 1000)):
        upstream = MIRROR / TOK / f"{split}.lc.norm.tok.de"
        entry = manifest["sets"][split]
        assert (out / entry["file"]).read_bytes() == upstream.read_bytes()
        assert entry["sha256"] == hashlib.sha256(upstream.read_bytes()).hexdigest() and entry["lines"] == lines
        assert entry["url"].endswith(f"{TOK}/{split}.lc.norm.tok.de") and str(MIRROR) not in entry["url"]
        found, url = references.tokenized_references(split, out)
        assert len(found) == lines and url == entry["url"]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    # the other target language of the same sets
    english = write_references(DataParams(mirror=str(MIRROR), src_lang="de", tgt_lang="en"), out, tmp_path / "cache")
    assert list(english["sets"]) == ["val", "test_2016_flickr"] and (out / "val.en").is_file()
    assert not (out / "val.de").exists()   # replaced whole


@needs_mirror
def test_a_reference_that_differs_from_its_published_hash_is_refused(tmp_path):
    """A mirror whose reference file was altered: sha256 mismatch, one DataError, the previous output kept."""
    bad = tmp_path / "mirror"
    shutil.copytree(MIRROR / TOK, bad / TOK, copy_function=shutil.copyfile)   # the mirror's files are read-only
    with open(bad / TOK / "val.lc.norm.tok.de", "a", encoding="utf-8") as f:
        f.write("ein zusätzlicher satz .\n")
    out = tmp_path / "data/references"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text('{"sets": {}}\n')
    with pytest.raises(DataError, match="sha256 mismatch"):
        write_references(DataParams(mirror=str(bad)), out, tmp_path / "cache")
    assert (out / "manifest.json").read_text() == '{"sets": {}}\n'


def test_wmt14_has_none_and_fetches_nothing(tmp_path):
    """WMT14 keeps its paper measure (bleu_tok_compound_split): an empty manifest, no download."""
    data = DataParams(dataset="wmt14_en_de", valid_set="newstest2013", test_sets=["newstest2014"])
    manifest = write_references(data, tmp_path / "refs", tmp_path / "cache")
    assert manifest == {"dataset": "wmt14_en_de", "tgt_lang": "de", "sets": {}}
    assert sorted(p.name for p in (tmp_path / "refs").iterdir()) == ["manifest.json"]
    assert not (tmp_path / "cache").exists()
    assert references.tokenized_references("newstest2014", tmp_path / "refs") is None


def test_no_references_stage_output_means_no_literature_measure(tmp_path):
    assert references.load_manifest(tmp_path / "absent") == {}
    assert references.tokenized_references("val", tmp_path / "absent") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        references.load_manifest(tmp_path / "broken")
