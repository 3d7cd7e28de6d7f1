"""pipeline/data: registry checks, verified downloads (HTTP, local folder, file://), safe
extraction, cleaning and the atomic output of ``prepare_corpus``.

Downloads are served from a local HTTP server on 127.0.0.1 or read from folders made in
``tmp_path``; the real Multi30k mirror (shared/data/multi30k beside the repository) is used when
present. Nothing here touches the network or the repository's checksums.json.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from pipeline.config.params import DataParams
from pipeline.data import checksums, multi30k, references, registry
from pipeline.data.corpus import prepare_corpus
from pipeline.data.fetch import extract_tar
from pipeline.data.registry import check_data_params
from pipeline.data.spec import DataError

from ...fakes import RAW, fake_multi30k, fake_statmt, link, sentences, tar, write_gz
from .conftest import cached, lines, publish

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]
MIRROR = REPO.parent / "shared" / "data" / "multi30k"


# ----------------------------------------------------------------------------- registry / params


def test_registry_lists_the_three_data_sets():
    assert list(registry.REGISTRY) == ["multi30k", "wmt14_en_de", "wmt14_en_fr"]
    m30k = registry.REGISTRY["multi30k"]
    assert m30k.base_url == "https://github.com/multi30k/dataset/raw/a3d2e0d26b56f3846f66a952536ffed4e401d05a/"
    assert m30k.languages == ["cs", "de", "en", "fr"]
    assert m30k.split_languages("test_2017_mscoco") == {"en", "de", "fr"}
    assert m30k.splits["test_2018_flickr"][0].unverified == {"de", "fr", "cs"}
    published = {c.sides[lang].file.path for cs in m30k.splits.values() for c in cs for lang in c.sides
                 if c.sides[lang].file.sha256}
    assert published == set(multi30k.MULTI30K_SHA256)
    fr = registry.REGISTRY["wmt14_en_fr"]
    assert [c.name for c in fr.splits["train"]] == ["europarl-v7", "commoncrawl", "un", "news-commentary-v9",
                                                    "giga-fren"]
    assert registry.REGISTRY["wmt14_en_de"].url(fr.splits["newstest2014"][0].sides["fr"].file) == \
        "http://www.statmt.org/wmt14/test-full.tgz"


def test_published_hashes_match_the_mirror_readme():
    readme = MIRROR.parent / "README.md"
    if not readme.is_file():
        pytest.skip(f"no mirror README at {readme}")
    listed = dict((path, digest) for digest, path in re.findall(r"([0-9a-f]{64})\s+(\S+)", readme.read_text()))
    tokenized = {f"data/task1/tok/{name}": digest for name, digest in references.MULTI30K_TOK_SHA256.items()}
    assert listed == {**multi30k.MULTI30K_SHA256, **tokenized}   # the raw files and the literature's references


@pytest.mark.parametrize("kwargs, message", [
    ({"dataset": "foo"}, "data.dataset 'foo' is not in the registry (known: multi30k, wmt14_en_de, wmt14_en_fr)"),
    ({"src_lang": "xx"}, "data.src_lang 'xx' is not a language of multi30k (known: cs, de, en, fr)"),
    ({"dataset": "wmt14_en_de", "tgt_lang": "fr", "valid_set": "newstest2013", "test_sets": ["newstest2014"]},
     "data.tgt_lang 'fr' is not a language of wmt14_en_de (known: de, en)"),
    ({"test_sets": ["test_2099"]}, "data.test_sets: 'test_2099' is not a split of multi30k (known: val, "),
    ({"tgt_lang": "cs", "test_sets": ["test_2017_flickr"]},
     "data.test_sets: test_2017_flickr has no cs side in multi30k"),
    ({"valid_set": "newstest2013"}, "data.valid_set: 'newstest2013' is not a split of multi30k"),
    ({"valid_set": "train"}, "data.valid_set: train is the training split"),
    ({"test_sets": ["test_2016_flickr", "test_2016_flickr"]}, "data.test_sets: test_2016_flickr is listed twice"),
])
def test_bad_data_params_name_the_key(kwargs, message):
    with pytest.raises(ValueError) as err:
        DataParams(**kwargs)
    assert str(err.value).startswith(message)


def test_valid_data_params_pass():
    check_data_params("wmt14_en_fr", "fr", "en", "newstest2013", ["newstest2014"])
    check_data_params("multi30k", "en", "fr", "val", ["test_2017_mscoco", "test_2018_flickr"])


# ----------------------------------------------------------------------------- downloads


def test_http_download_verified_and_written(http_mirror, tmp_path, monkeypatch):
    root, url = http_mirror
    fake_multi30k(root)
    hashes = publish(monkeypatch, root)
    monkeypatch.setenv("DATA_MIRROR", url)
    out, cache = tmp_path / "corpus", tmp_path / "cache"

    stats = prepare_corpus(DataParams(), out, cache, retries=0, progress=False)

    assert sorted(p.name for p in out.iterdir()) == [
        "stats.json", "test_2016_flickr.de", "test_2016_flickr.en", "train.de", "train.en", "val.de", "val.en"]
    assert lines(out / "train.de") == sentences("train", "de", 20)
    assert lines(out / "test_2016_flickr.en") == sentences("test_2016_flickr", "en", 5)
    assert stats["splits"]["train"]["raw"] == stats["splits"]["train"]["kept"] == 20
    assert json.loads((out / "stats.json").read_text()) == stats
    upstream = registry.REGISTRY["multi30k"].base_url
    assert {s["url"]: s["sha256"] for s in stats["sources"]} == {upstream + k: v for k, v in hashes.items()}
    assert not checksums.CHECKSUMS_FILE.exists()        # every hash was published: nothing recorded
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".corpus")]   # no temp dir left


# Truncated and tampered downloads (HTTP on 127.0.0.1, a folder, a file:// URL): see
# tests/reliability/test_downloads.py.


def test_first_download_hash_is_recorded_then_enforced(http_mirror, tmp_path, monkeypatch):
    """Upstream itself (a server on 127.0.0.1 as the registry's base URL): its hashes are recorded
    under ``sha256`` and enforced on every later download."""
    root, url = http_mirror
    fake_multi30k(root, {"train": 20, "val": 5, "test_2017_flickr": 5})
    hashes = publish(monkeypatch, root, skip=("test_2017_flickr.en.gz", "test_2017_flickr.de.gz"))
    monkeypatch.setitem(registry.REGISTRY, "multi30k", multi30k.multi30k_spec(sha256=hashes, base_url=url))
    data = DataParams(test_sets=["test_2017_flickr"])
    cache = tmp_path / "cache"

    stats = prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)
    recorded = json.loads(checksums.CHECKSUMS_FILE.read_text())
    assert set(recorded["sha256"]) == {f"{url}{RAW}/test_2017_flickr.en.gz", f"{url}{RAW}/test_2017_flickr.de.gz"}
    assert "mirror_sha256" not in recorded
    first = (tmp_path / "corpus" / "stats.json").read_bytes()
    assert all(set(s) == {"url", "sha256"} for s in stats["sources"])   # no "was the hash known" in the corpus

    # a cached file that went bad is downloaded again, and passes against the recorded hash; the
    # corpus is byte-identical to the first one, although its hashes were known this time
    cached(cache, "test_2017_flickr.de.gz").write_bytes(b"garbage")
    prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)
    assert (tmp_path / "corpus" / "stats.json").read_bytes() == first
    assert lines(tmp_path / "corpus" / "test_2017_flickr.de") == sentences("test_2017_flickr", "de", 5)

    # upstream changes behind our back: the recorded hash rejects it
    write_gz(root / RAW / "test_2017_flickr.de.gz", sentences("changed", "de", 5))
    cached(cache, "test_2017_flickr.de.gz").unlink()
    with pytest.raises(DataError, match="recorded from upstream in .*checksums.json"):
        prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)


def test_mirror_hashes_never_masquerade_as_upstream(http_mirror, tmp_path, monkeypatch):
    """A file first seen through a mirror is recorded for that mirror only: the real upstream file,
    with other bytes (a repacked archive on the mirror), is not checked against it."""
    root, url = http_mirror
    mirror, upstream = root / "mirror", root / "upstream"
    fake_multi30k(mirror, {"train": 20, "val": 5, "test_2017_flickr": 5})
    fake_multi30k(upstream, {"train": 20, "val": 5, "test_2017_flickr": 5})
    hashes = publish(monkeypatch, mirror, skip=("test_2017_flickr.en.gz", "test_2017_flickr.de.gz"))
    repacked = sentences("test_2017_flickr", "de", 5)
    (mirror / RAW / "test_2017_flickr.de.gz").write_bytes(
        gzip.compress("".join(f"{s}\n" for s in repacked).encode(), compresslevel=1, mtime=1))   # other bytes
    monkeypatch.setitem(registry.REGISTRY, "multi30k",
                        multi30k.multi30k_spec(sha256=hashes, base_url=f"{url}upstream/"))
    data = DataParams(test_sets=["test_2017_flickr"])
    cache = tmp_path / "cache"

    monkeypatch.setenv("DATA_MIRROR", f"{url}mirror")
    prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)
    recorded = json.loads(checksums.CHECKSUMS_FILE.read_text())
    assert recorded["sha256"] == {}
    assert set(recorded["mirror_sha256"]) == {f"{url}mirror"}
    assert len(recorded["mirror_sha256"][f"{url}mirror"]) == 2

    # from upstream: the mirror's record does not apply; upstream's bytes are recorded as upstream's
    monkeypatch.delenv("DATA_MIRROR")
    prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)
    recorded = json.loads(checksums.CHECKSUMS_FILE.read_text())
    key = f"{url}upstream/{RAW}/test_2017_flickr.de.gz"
    upstream_bytes = (upstream / RAW / "test_2017_flickr.de.gz").read_bytes()
    assert recorded["sha256"][key] == hashlib.sha256(upstream_bytes).hexdigest()
    assert recorded["sha256"][key] != recorded["mirror_sha256"][f"{url}mirror"][key]

    # the mirror again: now upstream's record is the reference, and the repacked file is refused
    monkeypatch.setenv("DATA_MIRROR", f"{url}mirror")
    cached(cache, "test_2017_flickr.de.gz").unlink()
    with pytest.raises(DataError, match="(?i)sha256.*recorded from upstream"):
        prepare_corpus(data, tmp_path / "corpus", cache, retries=0, progress=False)


def test_missing_file_on_mirror(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("DATA_MIRROR", str(tmp_path / "empty"))
    with pytest.raises(DataError, match=f"has no {RAW}/train.en.gz"):
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0)


def test_mirror_that_is_not_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_MIRROR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="is not a directory"):
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0)


def test_http_error_is_a_data_error(http_mirror, tmp_path, monkeypatch):
    root, url = http_mirror                     # serves nothing: 404
    monkeypatch.setenv("DATA_MIRROR", url)
    with pytest.raises(DataError, match=r"could not download http://127\.0\.0\.1:\d+/data/task1/raw/train.en.gz"):
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0)


# ----------------------------------------------------------------------------- the real mirror


@pytest.mark.skipif(not (MIRROR / RAW / "train.en.gz").is_file(),
                    reason=f"the Multi30k mirror is not at {MIRROR} (see shared/data/README.md)")
def test_real_multi30k_mirror(tmp_path, monkeypatch):
    monkeypatch.setenv("DATA_MIRROR", str(MIRROR))
    out = tmp_path / "corpus"
    stats = prepare_corpus(DataParams(limit_train_pairs=300), out, tmp_path / "cache", retries=0)

    train, val, test = (stats["splits"][s] for s in ("train", "val", "test_2016_flickr"))
    assert (train["raw"], train["kept"], train["dropped"]) == (
        29000, 300, {"empty": 0, "too_long": 0, "ratio": 0, "limit": 28700})
    assert (val["raw"], val["kept"]) == (1014, 1014)
    assert (test["raw"], test["kept"]) == (1000, 1000)
    for name, n in [("train.en", 300), ("train.de", 300), ("val.en", 1014), ("val.de", 1014),
                    ("test_2016_flickr.en", 1000), ("test_2016_flickr.de", 1000)]:
        assert len(lines(out / name)) == n, name
    first = gzip.open(MIRROR / RAW / "train.en.gz", "rt", encoding="utf-8").readline().strip()
    assert lines(out / "train.en")[0] == first
    assert {s["sha256"] for s in stats["sources"]} <= set(multi30k.MULTI30K_SHA256.values())


# ----------------------------------------------------------------------------- reading / cleaning


def _prepare_local(tmp_path, monkeypatch, files: dict[str, list[str] | bytes], **params):
    root = tmp_path / "mirror"
    fake_multi30k(root)
    for name, content in files.items():
        write_gz(root / RAW / name, content)
    publish(monkeypatch, root)
    monkeypatch.setenv("DATA_MIRROR", str(root))
    return prepare_corpus(DataParams(**params), tmp_path / "corpus", tmp_path / "cache", retries=0)


def test_cleaning_drops_and_counts_by_reason(tmp_path, monkeypatch):
    en = ["  a  b  ", "", "x " * 11, "one", "ok pair\u2028here", "last pair", "kept beyond limit"]
    de = ["c d", "leer", "y", "eins zwei drei vier", "gut\rhier", "letztes paar", "über die Grenze"]
    stats = _prepare_local(tmp_path, monkeypatch, {"train.en.gz": en, "train.de.gz": de},
                           max_words=10, max_ratio=3.0, limit_train_pairs=3)
    train = stats["splits"]["train"]
    assert train["raw"] == 7 and train["kept"] == 3
    assert train["dropped"] == {"empty": 1, "too_long": 1, "ratio": 1, "limit": 1}
    out = tmp_path / "corpus"
    assert lines(out / "train.en") == ["a  b", "ok pair here", "last pair"]   # stripped, line breaks -> spaces
    assert lines(out / "train.de") == ["c d", "gut hier", "letztes paar"]


def test_misaligned_files_name_both_and_their_counts(tmp_path, monkeypatch):
    with pytest.raises(DataError) as err:
        _prepare_local(tmp_path, monkeypatch, {"train.de.gz": sentences("train", "de", 19)})
    assert str(err.value) == (f"misaligned corpus: {RAW}/train.en.gz has 20 lines but {RAW}/train.de.gz has 19")
    assert not (tmp_path / "corpus").exists()


def test_invalid_utf8_names_file_and_line(tmp_path, monkeypatch):
    bad = "".join(f"{s}\n" for s in sentences("val", "de", 5)).encode().replace(b"number 2", b"number \xff2")
    with pytest.raises(DataError, match=rf"^{RAW}/val.de.gz: line 3 is not valid UTF-8"):
        _prepare_local(tmp_path, monkeypatch, {"val.de.gz": bad})
    assert not (tmp_path / "corpus").exists()


def test_empty_line_in_an_evaluation_set_is_an_error(tmp_path, monkeypatch):
    test = sentences("test", "en", 5)
    test[3] = "   "
    with pytest.raises(DataError, match=rf"^test_2016_flickr: {RAW}/test_2016_flickr.en.gz sentence 4 is empty"):
        _prepare_local(tmp_path, monkeypatch, {"test_2016_flickr.en.gz": test})


def test_empty_corpus_after_cleaning(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"^train: no sentence pairs left after cleaning "
                                        r"\(20 raw pairs; dropped: too_long 20\)"):
        _prepare_local(tmp_path, monkeypatch, {}, max_words=2)


def test_truncated_gzip_stream_is_a_data_error(tmp_path, monkeypatch):
    data = gzip.compress(("".join(f"{s}\n" for s in sentences("val", "en", 500))).encode(), mtime=0)
    root = tmp_path / "mirror"
    fake_multi30k(root)
    (root / RAW / "val.en.gz").write_bytes(data[:-40])      # published hash of the truncated file
    publish(monkeypatch, root)
    monkeypatch.setenv("DATA_MIRROR", str(root))
    with pytest.raises(DataError, match=rf"^{RAW}/val.en.gz: cannot read"):
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0)


# ----------------------------------------------------------------------------- archives


@pytest.mark.parametrize("evil", [("../evil.txt", b"escaped"), link("link", "/etc/passwd"),
                                  link("sub/link", "../../outside")])
@pytest.mark.parametrize("members", [None, "named"])
def test_extraction_rejects_path_traversal(tmp_path, evil, members):
    archive = tar(tmp_path / "evil.tgz", [("good.txt", b"fine\n"), evil])
    dest = tmp_path / "x" / "dest"
    name = evil.name if isinstance(evil, tarfile.TarInfo) else evil[0]
    with pytest.raises(DataError, match="unsafe member rejected"):
        extract_tar(archive, dest, None if members is None else ["good.txt", name])
    assert not dest.exists()
    assert not (tmp_path / "x" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    assert list((tmp_path / "x").iterdir()) == []                    # temp dir cleaned up


def test_extraction_of_named_members(tmp_path):
    archive = tar(tmp_path / "a.tar", [("./d/one.txt", b"1\n"), ("d/two.txt", b"2\n"), ("three", b"3\n")], "w")
    dest = extract_tar(archive, tmp_path / "dest", ["d/one.txt", "d/two.txt"])
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == ["d/one.txt", "d/two.txt"]
    with pytest.raises(DataError, match="a.tar has no member nope"):
        extract_tar(archive, tmp_path / "dest2", ["nope"])
    assert not (tmp_path / "dest2").exists()


# ----------------------------------------------------------------------------- WMT14 layout


@pytest.mark.parametrize("name", ["wmt14_en_de", "wmt14_en_fr"])
def test_wmt14_archives_are_read_as_registered(name, tmp_path, monkeypatch):
    spec = registry.REGISTRY[name]
    other = name[-2:]
    root = tmp_path / "statmt"
    fake_statmt(root, spec)
    monkeypatch.setenv("DATA_MIRROR", root.as_uri())
    data = DataParams(dataset=name, src_lang=other, tgt_lang="en", valid_set="newstest2013", test_sets=["newstest2014"])
    out, cache = tmp_path / "corpus", tmp_path / "cache"

    stats = prepare_corpus(data, out, cache, retries=0)

    corpora = [c.name for c in spec.splits["train"]]
    assert lines(out / f"train.{other}") == [s for c in corpora for s in sentences(c, other, 3)]
    assert stats["splits"]["train"]["corpora"] == {c: 3 for c in corpora}
    assert lines(out / "newstest2013.en") == sentences("newstest2013", "en", 3)
    assert lines(out / f"newstest2014.{other}") == sentences("newstest2014", other, 3)
    assert lines(out / "newstest2014.en") == sentences("newstest2014", "en", 3)
    recorded = json.loads(checksums.CHECKSUMS_FILE.read_text())["mirror_sha256"][str(root.resolve())]
    assert set(recorded) == {spec.url(f) for c in spec.splits.values() for x in c
                             for f in {s.file for s in x.sides.values()}}
    assert all(recorded[s["url"]] == s["sha256"] for s in stats["sources"])

    # the next run checks the recorded hashes: a changed archive on the mirror is refused
    (root / "wmt14" / "dev.tgz").write_bytes((root / "wmt14" / "dev.tgz").read_bytes() + b"\0")
    shutil.rmtree(cache)
    with pytest.raises(DataError, match=r"sha256 mismatch for .*dev\.tgz.*checksums\.json"):
        prepare_corpus(data, out, cache, retries=0)
    assert lines(out / "newstest2013.en") == sentences("newstest2013", "en", 3)    # previous output kept


# ----------------------------------------------------------------------------- incoming pairs


def _incoming(tmp_path: Path, files: dict[str, list[str] | str]) -> Path:
    folder = tmp_path / "incoming"
    folder.mkdir(exist_ok=True)
    (folder / "README.md").write_text("not data\n")
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else "".join(f"{s}\n" for s in content))
    return folder


def test_incoming_pairs_are_cleaned_appended_and_counted(tmp_path, monkeypatch):
    folder = _incoming(tmp_path, {
        "b-news.en": ["new one", "", "en val sentence number 1 with some words", "x " * 11, "new two"],
        "b-news.de": ["neu eins", "leer", "de val satz", "y", "neu zwei"],
        "a-web.en": ["web one"], "a-web.de": ["netz eins"],
        "other.fr": ["ignored: not a language of the pair"], "notes.txt": "ignored",
    })
    stats = _prepare_local(tmp_path, monkeypatch, {}, max_words=10, limit_train_pairs=3, incoming_dir=str(folder))
    out = tmp_path / "corpus"
    # the data set's first 3 pairs (the limit), then the incoming pairs by file name, cleaned
    assert lines(out / "train.en")[3:] == ["web one", "new one", "new two"]
    assert lines(out / "train.de")[3:] == ["netz eins", "neu eins", "neu zwei"]
    train = stats["splits"]["train"]
    assert train["kept"] == 6 and train["raw"] == 20 + 6
    assert train["dropped"] == {"empty": 1, "too_long": 1, "ratio": 0, "limit": 17, "overlap": 1}
    assert train["corpora"] == {"train": 20, "incoming/a-web": 1, "incoming/b-news": 5}
    incoming = stats["incoming"]
    assert incoming["raw"] == 6 and incoming["kept"] == 3 and incoming["dir"] == str(folder)
    assert incoming["pairs"]["b-news"]["kept"] == 2 and len(incoming["pairs"]["a-web"]["sha256"]) == 2
    assert json.loads((out / "stats.json").read_text())["incoming"] == incoming


@pytest.mark.parametrize("files, message", [
    ({"news.en": ["a"]}, r"incoming/news\.de is missing: incoming data comes in pairs <name>\.en and <name>\.de"),
    ({"news.en": ["a", "b"], "news.de": ["a"]},
     r"misaligned corpus: .*incoming/news\.en has 2 lines but .*news\.de has 1"),
    ({"news.en": ["a"], "news.de": ["a"], "more.en.dvc": "outs: []\n"}, r"incoming/more\.en is versioned by DVC "
                                                                        r"\(more\.en\.dvc\) but missing: run dvc pull"),
])
def test_bad_incoming_data_is_a_data_error(files, message, tmp_path, monkeypatch):
    folder = _incoming(tmp_path, files)
    with pytest.raises(DataError, match=message):
        _prepare_local(tmp_path, monkeypatch, {}, incoming_dir=str(folder))
    assert not (tmp_path / "corpus").exists()


def test_no_incoming_folder_or_setting_means_no_incoming_data(tmp_path, monkeypatch):
    stats = _prepare_local(tmp_path, monkeypatch, {}, incoming_dir=str(tmp_path / "absent"))
    assert stats["incoming"] == {"dir": str(tmp_path / "absent"), "pairs": {}, "raw": 0, "kept": 0}
    assert _prepare_local(tmp_path, monkeypatch, {}, incoming_dir="")["splits"]["train"]["kept"] == 20
