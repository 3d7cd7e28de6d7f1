"""Downloads served on 127.0.0.1: a truncated one and a tampered one are rejected, and nothing
of them reaches data/.

- The download stage as DVC runs it (``python -m pipeline.stages.download``, a subprocess)
  against the real Multi30k files served over HTTP, whose sha256 the registry publishes: the
  training file cut short in transfer (full Content-Length announced, half the body sent,
  connection closed), served truncated, or with one bit flipped. Each is retried with backoff
  (DOWNLOAD_RETRIES), then refused with one ``error:`` line; data/ holds no file afterwards but,
  for the cut transfer, the hidden partial file (a prefix of the real one) a later run resumes
  from (tests/pipeline/data/test_resumable.py).
- The library (``prepare_corpus``) on a small fake mirror, over HTTP, a folder and a file://
  URL: a corrupt file is refused before anything is written, the previous output is kept and
  the bad file is not cached. (Moved here from tests/pipeline/test_datasets.py.)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.config.params import DataParams
from pipeline.data import checksums, fetch, multi30k, registry
from pipeline.data.corpus import prepare_corpus
from pipeline.data.resumable import partial_path
from pipeline.data.spec import DataError

from ..fakes import RAW, corrupt, fake_multi30k, http_server, published_spec
from .conftest import REPO

pytestmark = pytest.mark.fast

MIRROR = REPO.parent / "shared" / "data" / "multi30k"
NEEDED = [f"{RAW}/{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")]
CACHE_NAME = registry.REGISTRY["multi30k"].cache_name


def files_under(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir())


@pytest.mark.pipeline
@pytest.mark.skipif(not (MIRROR / RAW / "train.en.gz").is_file(), reason=f"the Multi30k mirror is not at {MIRROR}")
def test_download_stage_rejects_truncated_and_tampered_downloads(tmp_path):
    """Three stage processes at once (each mostly waits out pooch's backoff), one server each."""
    target = f"{RAW}/train.en.gz"            # the first file the stage fetches
    variants = {"cut-in-transfer": None, "truncated": "truncated", "tampered": "tampered"}
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(limit_train_pairs=50, incoming_dir="")
    checksums_before = checksums.CHECKSUMS_FILE.read_bytes() if checksums.CHECKSUMS_FILE.exists() else None
    published = multi30k.MULTI30K_SHA256[target]

    servers, procs = {}, {}
    try:
        for name, how in variants.items():
            served = tmp_path / name / "served"
            for rel in NEEDED:
                (served / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(MIRROR / rel, served / rel)
            if how:
                corrupt(served / target, how)
            assert hashlib.sha256((served / target).read_bytes()).hexdigest() != published or how is None
            servers[name] = http_server(served, cut={target} if how is None else set())
            url, requests = servers[name].__enter__()
            ws = tmp_path / name / "ws"
            ws.mkdir()
            (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            env = {k: v for k, v in os.environ.items() if k != "DATA_MIRROR"}
            env.update(PYTHONPATH=str(REPO), DATA_MIRROR=url, NO_PROXY="127.0.0.1,localhost",
                       no_proxy="127.0.0.1,localhost")
            procs[name] = (subprocess.Popen([sys.executable, "-m", "pipeline.stages.download"], cwd=ws, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                           ws, url, requests, time.monotonic())
        for name, (proc, ws, url, requests, started) in procs.items():
            out, err = proc.communicate(timeout=120)
            seconds = time.monotonic() - started
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert proc.returncode == 2, (name, out, err)
            assert len(errors) == 1 and err.rstrip().endswith(errors[0]), (name, err)
            assert "Traceback" not in err
            assert f"{url}{target}" in errors[0], (name, errors[0])
            if variants[name]:
                assert f"sha256:{published}" in errors[0] or published in errors[0], (name, errors[0])
            # retried with backoff (1 + DOWNLOAD_RETRIES attempts, waits 1 + 2 + 3 s), then refused
            assert requests.count(f"/{target}") == 1 + fetch.DOWNLOAD_RETRIES, (name, requests)
            assert seconds >= 6, (name, seconds)
            if variants[name]:
                assert files_under(ws / "data") == [], (name, files_under(ws / "data"))
            else:   # only the hidden partial file, a prefix of the real one, kept to resume from
                partial = partial_path(ws / "data" / "cache" / CACHE_NAME / target)
                assert files_under(ws / "data") == [partial.relative_to(ws / "data").as_posix()]
                assert (MIRROR / target).read_bytes().startswith(partial.read_bytes())
    finally:
        for proc, *_ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for server in servers.values():
            server.__exit__(None, None, None)
    after = checksums.CHECKSUMS_FILE.read_bytes() if checksums.CHECKSUMS_FILE.exists() else None
    assert after == checksums_before


# ----------------------------------------------------------------------------- the library


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No DATA_MIRROR from the caller's shell; checksums recorded in tmp, never in the repo."""
    monkeypatch.delenv("DATA_MIRROR", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(checksums, "CHECKSUMS_FILE", tmp_path / "checksums.json")


@pytest.mark.parametrize("how", ["truncated", "tampered"])
@pytest.mark.parametrize("via", ["http", "folder", "file-url"])
def test_corrupt_file_rejected_before_anything_is_written(how, via, isolated, tmp_path, monkeypatch):
    root = fake_multi30k(tmp_path / "served")
    monkeypatch.setitem(registry.REGISTRY, "multi30k", published_spec(root))
    corrupt(root / RAW / "train.de.gz", how)
    out, cache = tmp_path / "corpus", tmp_path / "cache"
    out.mkdir()
    (out / "previous.txt").write_text("old output\n")

    with http_server(root) as (url, requests):
        monkeypatch.setenv("DATA_MIRROR", {"http": url, "folder": str(root), "file-url": root.as_uri()}[via])
        with pytest.raises(DataError, match=r"(?i)hash|sha256") as err:
            prepare_corpus(DataParams(), out, cache, retries=0, progress=False)
    assert ("/" + RAW + "/train.de.gz" in requests) == (via == "http")

    assert "\n" not in str(err.value)
    assert sorted(p.name for p in out.iterdir()) == ["previous.txt"]           # output untouched
    assert files_under(cache / CACHE_NAME) == [f"{RAW}/train.en.gz"]             # bad file not cached
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".corpus")]  # no temp dir left
    assert not checksums.CHECKSUMS_FILE.exists()
