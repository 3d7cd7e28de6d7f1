"""Fixtures of the pipeline.data tests: no DATA_MIRROR from the shell, checksums recorded in tmp
(never in the repository), an HTTP server on 127.0.0.1, published hashes for a fake Multi30k."""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from pipeline.data import checksums, multi30k, registry

from ...fakes import RAW

CACHE_NAME = registry.REGISTRY["multi30k"].cache_name


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No DATA_MIRROR from the caller's shell; checksums recorded in tmp, never in the repo."""
    monkeypatch.delenv("DATA_MIRROR", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setattr(checksums, "CHECKSUMS_FILE", tmp_path / "checksums.json")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass


@pytest.fixture
def http_mirror(tmp_path):
    """(folder served, base URL) of an HTTP server on 127.0.0.1 with an ephemeral port."""
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def publish(monkeypatch, root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Register the sha256 of every file under ``root`` (except ``skip``) as Multi30k's published hashes."""
    hashes = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted((root / RAW).glob("*.gz")) if p.name not in skip}
    monkeypatch.setitem(registry.REGISTRY, "multi30k", multi30k.multi30k_spec(sha256=hashes))
    return hashes


def cached(cache: Path, name: str) -> Path:
    return cache / CACHE_NAME / RAW / name


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]
