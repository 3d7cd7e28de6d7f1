"""Small inputs for the data and reliability tests: a Multi30k-shaped mirror (gzip files), statmt-shaped
WMT14 archives, a synthetic corpus, and a snapshot of every file in a folder."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from pipeline.data import multi30k
from pipeline.data.spec import DatasetSpec, RemoteFile

RAW = "data/task1/raw"


def sentences(split: str, lang: str, n: int) -> list[str]:
    return [f"{lang} {split} sentence number {i} with some words" for i in range(n)]


def write_gz(path: Path, content: list[str] | bytes) -> None:
    data = content if isinstance(content, bytes) else "".join(f"{s}\n" for s in content).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0))


def fake_multi30k(root: Path, sizes: dict[str, int] | None = None, langs=("en", "de")) -> Path:
    """A small Multi30k layout (gzip files) under ``root``."""
    sizes = sizes or {"train": 20, "val": 5, "test_2016_flickr": 5}
    for split, n in sizes.items():
        for lang in langs:
            write_gz(root / RAW / f"{split}.{lang}.gz", sentences(split, lang, n))
    return root


def published_spec(root: Path, skip: tuple[str, ...] = ()) -> DatasetSpec:
    """Multi30k with the sha256 of every file under ``root`` (except ``skip``) as its published hashes."""
    hashes = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted((root / RAW).glob("*.gz")) if p.name not in skip}
    return multi30k.multi30k_spec(sha256=hashes)


def corrupt(path: Path, how: str) -> None:
    """``truncated``: keep the first half of the file; ``tampered``: flip one bit in the middle."""
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "tampered":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        raise ValueError(how)


# ----------------------------------------------------------------------------- params


def params_with(sections: dict[str, dict]) -> dict:
    """The repository's params.yaml with the keys of ``sections`` replaced, section by section; a
    given ``model`` section replaces the whole section, since the default's overrides (d_ff, say)
    are of its preset and would otherwise reshape the preset a test names."""
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    for section, values in sections.items():
        params[section] = dict(values) if section == "model" else {**params.get(section, {}), **values}
    return params


# ----------------------------------------------------------------------------- archives


def tar(path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                archive.addfile(info, io.BytesIO(entry[1]))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3   # /dev/null's numbers
    return info


def statmt_members(spec: DatasetSpec, n: int = 3) -> dict[RemoteFile, dict[str, bytes]]:
    """The members of each statmt.org archive of ``spec``, each side ``n`` sentences."""
    contents: dict[RemoteFile, dict[str, bytes]] = {}
    for corpora in spec.splits.values():
        for corpus in corpora:
            for lang, side in corpus.sides.items():
                text = sentences(corpus.name, lang, n)
                if side.fmt == "sgm":
                    segs = "".join(f'<seg id="{i + 1}">{s}</seg>\n' for i, s in enumerate(text))
                    data = (f'<refset setid="{corpus.name}" srclang="any" trglang="{lang}">\n'
                            f'<doc sysid="ref" docid="x" genre="news" origlang="en">\n<p>\n{segs}</p>\n</doc>\n'
                            '</refset>\n').encode()
                else:
                    data = "".join(f"{s}\n" for s in text).encode()
                    if side.fmt == "gz":
                        data = gzip.compress(data, mtime=0)
                contents.setdefault(side.file, {})[side.member] = data
    return contents


def fake_statmt(root: Path, spec: DatasetSpec,
                replace: dict[str, list[tarfile.TarInfo | tuple[str, bytes]]] | None = None) -> Path:
    """Archives laid out like statmt.org's for ``spec``; ``replace`` maps an archive's path to other entries."""
    for file, members in statmt_members(spec).items():
        path = root / file.path
        entries = (replace or {}).get(file.path, list(members.items()))
        tar(path, entries, "w:gz" if path.suffix == ".tgz" else "w")
    return root


# ----------------------------------------------------------------------------- corpus, snapshots


WORDS = {
    "en": "a man woman dog child plays runs in park with red ball two people street on water blue".split(),
    "de": "ein mann frau hund kind spielt läuft im park mit rotem ball zwei leute straße auf wasser blau".split(),
}


def synthetic_corpus(folder: Path, sizes: dict[str, int], seed: int = 0) -> None:
    """Parallel text files ``<split>.<lang>`` of random sentences over a small vocabulary per language."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        rows = {lang: [] for lang in WORDS}
        for _ in range(n):
            idx = rng.integers(0, len(WORDS["en"]), size=rng.integers(3, 9))
            for lang, words in WORDS.items():
                rows[lang].append(" ".join(words[i] for i in idx))
        for lang, lines in rows.items():
            (folder / f"{split}.{lang}").write_text("".join(f"{s}\n" for s in lines), encoding="utf-8")


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (symlinks by their target), by relative path."""
    found = {}
    if not root.exists():
        return found
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = "symlink -> " + str(path.readlink())
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


# ----------------------------------------------------------------------------- HTTP on 127.0.0.1


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; remembers every requested path; ``cut`` paths are sent short: the full
    Content-Length is announced, half the body is sent, then the connection is closed."""

    requests: list[str]
    cut: set[str]

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        self.requests.append(self.path)
        if self.path.lstrip("/") in self.cut:
            body = Path(self.directory, self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@contextmanager
def serving(handler: type, root: Path) -> Iterator[str]:
    """``handler`` serving ``root`` on 127.0.0.1 (ephemeral port) in a thread; yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def http_server(root: Path, cut: set[str] | None = None) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 (ephemeral port) serving ``root``; yields (base URL, requested paths)."""
    requests: list[str] = []
    handler = type("Handler", (QuietHandler,), {"requests": requests, "cut": set(cut or ())})
    with serving(handler, root) as url:
        yield url, requests


class RangeHandler(QuietHandler):
    """Honours ``Range: bytes=N-`` (206 + Content-Range) and cuts each ``cut`` path short on its
    first request only; ``log`` gets (path, Range header or None) for every request."""

    log: list[tuple[str, str | None]]
    honour_ranges: bool

    def do_GET(self):  # noqa: N802 - http.server's name
        rel, wanted = self.path.lstrip("/"), self.headers.get("Range")
        self.log.append((self.path, wanted))
        path = Path(self.directory, rel)
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        start = int(wanted.removeprefix("bytes=").rstrip("-")) if wanted and self.honour_ranges else 0
        if start >= size > 0:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = size - start
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        cut = rel in self.cut
        self.cut.discard(rel)
        left = length // 2 if cut else length
        with open(path, "rb") as f:   # streamed: the data-scale bench serves archives of gigabytes
            f.seek(start)
            while left > 0 and (chunk := f.read(min(1 << 20, left))):
                self.wfile.write(chunk)
                left -= len(chunk)
        if cut:
            self.wfile.flush()
            self.close_connection = True


@contextmanager
def range_server(root: Path, cut_once: set[str], honour_ranges: bool = True
                 ) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """An HTTP server on 127.0.0.1 serving ``root`` with (or without) Range support, cutting each
    ``cut_once`` path short on its first request; yields (base URL, [(path, Range header)])."""
    log: list[tuple[str, str | None]] = []
    handler = type("Handler", (RangeHandler,), {"requests": [], "cut": set(cut_once), "log": log,
                                                "honour_ranges": honour_ranges})
    with serving(handler, root) as url:
        yield url, log
