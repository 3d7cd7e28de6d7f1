"""Atomic writes and content hashes: the one place every file and folder of the project is written.

A write goes to a temporary file (or folder) beside its target, is flushed to disk, takes the
mode a plain ``open()`` / ``mkdir()`` would give under the process umask (``mkstemp`` and
``mkdtemp`` create 0600 / 0700, which would hide outputs from other users of a shared machine),
and is renamed over the target only once complete: a crash at any moment leaves the old file or
the new one, never half of one. Temporary names start with ``.<name>.`` so that a reader listing
the folder, and the cleanup of a killed run, can tell them apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

CHUNK_BYTES = 1 << 20


def umask_mode(directory: bool = False) -> int:
    """The permission bits ``open()`` (0666) or ``mkdir()`` (0777) would give under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside ``directory`` durable (POSIX: the directory entry is data of the folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write(file)`` on a binary temporary file beside ``path``, fsync it, then rename it
    over ``path`` with the umask's mode. On any error the temporary file is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, value: Any) -> None:
    """JSON with sorted keys and a final newline (stable bytes: DVC hashes outputs)."""
    write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    """One line per item, streamed into the temporary file (no list of the whole output)."""
    def write(f: IO[bytes]) -> None:
        for line in lines:
            f.write(line.encode("utf-8") + b"\n")
    atomic_write(path, write)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; when the block ends without error it
    replaces ``path`` (old folder renamed aside, new one renamed in, old one deleted), else it is
    deleted and ``path`` is untouched. Its files should be closed (and fsynced) by then."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, umask_mode(directory=True))
        yield tmp
        replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(new: Path, target: Path) -> None:
    """Put folder ``new`` at ``target``: rename the old one aside, rename ``new`` in, delete the old.
    Between the two renames ``target`` is briefly absent, never partial."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync_files(folder: Path) -> None:
    """fsync every file under ``folder`` (before an ``atomic_dir`` block publishes it)."""
    for file in folder.rglob("*"):
        if file.is_file() and not file.is_symlink():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


def file_sha256(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Hex sha256 of a file's bytes, read in chunks (a big model's file is ~1 GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def dir_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a folder: its files' relative paths and contents, in sorted order."""
    root = Path(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode("utf-8") + b"\0")
        digest.update(file_sha256(file).encode("ascii") + b"\n")
    return digest.hexdigest()
