"""pipeline/data/resumable.py: an interrupted HTTP download continues with a Range request when the
server allows, at pooch's next attempt or at the next run; otherwise it starts over. Real
downloads from a server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.params import DataParams
from pipeline.data import checksums, registry
from pipeline.data.corpus import prepare_corpus
from pipeline.data.resumable import partial_path
from pipeline.data.spec import DataError
from tests.fakes import RAW, fake_multi30k, published_spec, range_server

pytestmark = pytest.mark.fast

TARGET = f"{RAW}/train.en.gz"


@pytest.fixture
def served(tmp_path, monkeypatch) -> Path:
    """A published fake Multi30k; checksums recorded in tmp, never in the repo."""
    monkeypatch.delenv("DATA_MIRROR", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(checksums, "CHECKSUMS_FILE", tmp_path / "checksums.json")
    root = fake_multi30k(tmp_path / "served", sizes={"train": 400, "val": 5, "test_2016_flickr": 5})
    monkeypatch.setitem(registry.REGISTRY, "multi30k", published_spec(root))
    return root


def cached(cache: Path) -> Path:
    return cache / registry.REGISTRY["multi30k"].cache_name / TARGET


def requests_for(log: list[tuple[str, str | None]]) -> list[str | None]:
    """The Range header of each request for TARGET (None: the whole file)."""
    return [wanted for path, wanted in log if path == f"/{TARGET}"]


def test_cut_transfer_resumes_at_the_next_attempt(served, tmp_path, monkeypatch):
    size = (served / TARGET).stat().st_size
    with range_server(served, cut_once={TARGET}) as (url, log):
        monkeypatch.setenv("DATA_MIRROR", url)
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=1, progress=False)
    assert requests_for(log) == [None, f"bytes={size // 2}-"]     # the second asks for the rest only
    assert cached(tmp_path / "cache").read_bytes() == (served / TARGET).read_bytes()
    assert not partial_path(cached(tmp_path / "cache")).exists()
    assert len((tmp_path / "corpus" / "train.en").read_text().splitlines()) == 400


def test_cut_transfer_resumes_at_the_next_run(served, tmp_path, monkeypatch):
    size = (served / TARGET).stat().st_size
    with range_server(served, cut_once={TARGET}) as (url, log):
        monkeypatch.setenv("DATA_MIRROR", url)
        with pytest.raises(DataError, match=rf"could not download {url}{TARGET} after 1 attempt"):
            prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0, progress=False)
        partial = partial_path(cached(tmp_path / "cache"))
        assert partial.read_bytes() == (served / TARGET).read_bytes()[: size // 2]   # kept for the next run
        assert not cached(tmp_path / "cache").exists() and not (tmp_path / "corpus").exists()

        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0, progress=False)
    assert requests_for(log) == [None, f"bytes={size // 2}-"]
    assert cached(tmp_path / "cache").read_bytes() == (served / TARGET).read_bytes()
    assert not partial.exists()


def test_server_without_ranges_starts_over(served, tmp_path, monkeypatch):
    with range_server(served, cut_once={TARGET}, honour_ranges=False) as (url, log):
        monkeypatch.setenv("DATA_MIRROR", url)
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=1, progress=False)
    size = (served / TARGET).stat().st_size
    assert requests_for(log) == [None, f"bytes={size // 2}-"]     # asked, got the whole file (200)
    assert cached(tmp_path / "cache").read_bytes() == (served / TARGET).read_bytes()


def test_held_bytes_that_do_not_fit_start_over(served, tmp_path, monkeypatch):
    """A partial file longer than the served one (another version upstream): 416, then from byte 0."""
    partial = partial_path(cached(tmp_path / "cache"))
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * ((served / TARGET).stat().st_size + 10))
    with range_server(served, cut_once=set()) as (url, log):
        monkeypatch.setenv("DATA_MIRROR", url)
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=0, progress=False)
    assert requests_for(log)[0].startswith("bytes=") and requests_for(log)[1] is None
    assert cached(tmp_path / "cache").read_bytes() == (served / TARGET).read_bytes()
    assert not partial.exists()


def test_tampered_partial_is_not_resumed_from(served, tmp_path, monkeypatch):
    """Held bytes that are not the file's prefix give a complete file with a wrong hash: refused,
    and deleted, so the next attempt downloads the whole file and succeeds."""
    partial = partial_path(cached(tmp_path / "cache"))
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\0" * 100)
    with range_server(served, cut_once=set()) as (url, log):
        monkeypatch.setenv("DATA_MIRROR", url)
        prepare_corpus(DataParams(), tmp_path / "corpus", tmp_path / "cache", retries=1, progress=False)
    assert requests_for(log) == ["bytes=100-", None]
    assert cached(tmp_path / "cache").read_bytes() == (served / TARGET).read_bytes()
