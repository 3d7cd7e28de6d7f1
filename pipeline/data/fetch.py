"""Fetching a data set's files: from upstream or a mirror, verified by sha256, and extracting archives.

``DATA_MIRROR`` (or ``data.mirror``) replaces the upstream base URL. It may be a local directory
laid out like upstream (``<mirror>/data/task1/raw/train.en.gz`` for Multi30k,
``<mirror>/wmt13/training-parallel-europarl-v7.tgz`` for WMT14), a ``file://`` URL of one, or an
``http(s)://`` base URL. A local file is copied into the download cache through a temporary file
while its sha256 is computed, and only renamed into place when it matches. HTTP(S) downloads go
through pooch (hash check before the file is moved into the cache, ``retry_if_failed`` with a
growing wait) with ``pipeline.data.resumable``'s downloader: an interrupted transfer continues with an
HTTP Range request, at the next attempt or run, when the server allows (progress bar on a
terminal). Which hash a file must have, and where a first-seen hash is recorded, is
``pipeline.data.checksums``'s business.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from pipeline.data.checksums import UPSTREAM, expected_hash, record_checksum
from pipeline.data.resumable import ResumableDownloader, partial_path
from pipeline.data.spec import DataError, DatasetSpec, RemoteFile
from transformer.atomic import file_sha256, umask_mode

DOWNLOAD_RETRIES = 3          # pooch retry_if_failed: waits 1 s, 2 s, 3 s between attempts
DOWNLOAD_TIMEOUT_S = 60       # per request (connect / between bytes), not for the whole file


def local_mirror(mirror: str) -> Path | None:
    """The directory a mirror names (a path or ``file://`` URL), or None for upstream / http(s)."""
    if not mirror:
        return None
    parsed = urllib.parse.urlparse(mirror)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        return None
    if scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise DataError(f"data mirror {mirror!r}: file:// URLs must name a local path")
        path = Path(urllib.request.url2pathname(parsed.path))
    elif len(scheme) > 1:   # one letter: a Windows drive
        raise DataError(f"data mirror {mirror!r}: unsupported scheme {scheme!r} (use a folder, file://, http:// or https://)")
    else:
        path = Path(mirror).expanduser()
    if not path.is_dir():
        raise DataError(f"data mirror {mirror!r} (DATA_MIRROR or data.mirror) is not a directory")
    return path


def _copy_verified(source: Path, target: Path, expected: str | None) -> str:
    """Copy ``source`` to ``target`` through a temp file, renamed only if its sha256 is ``expected``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, open(source, "rb") as inp:
            for chunk in iter(lambda: inp.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if expected and actual != expected:
            raise DataError(f"sha256 mismatch for {source}: expected {expected}, got {actual}; file not used")
        os.chmod(tmp, umask_mode())
        os.replace(tmp, target)
        return actual
    finally:
        Path(tmp).unlink(missing_ok=True)


def mirror_key(mirror: str) -> str:
    """How checksums.json names a mirror: its resolved folder, or its base URL ("" = upstream)."""
    if not mirror:
        return UPSTREAM
    folder = local_mirror(mirror)
    return str(folder.resolve()) if folder is not None else mirror.rstrip("/")


def fetch_file(
    spec: DatasetSpec,
    file: RemoteFile,
    cache_dir: Path,
    mirror: str = "",
    *,
    checksums_file: Path | None = None,
    retries: int = DOWNLOAD_RETRIES,
    progress: bool | None = None,
    record: bool = True,
) -> tuple[Path, str, str]:
    """A verified copy of ``file`` in ``cache_dir/<spec.cache_name>/<file.path>``.

    The expected sha256 is the published one, else the one recorded from upstream, else (reading
    through a mirror) the one recorded from that mirror (``pipeline.data.checksums``). With none,
    the file is trusted on first use and its hash recorded under where it came from (unless
    ``record`` is False: ``prepare_corpus`` records only once the file proved readable); a cached
    copy of unknown provenance is fetched again rather than trusted. Returns the cached path, its
    sha256 and where that hash came from (``Expected.origin``). Any failure (missing file, network
    error after ``retries`` retries, hash mismatch) raises ``DataError`` and leaves no unverified
    file in the cache.
    """
    url = spec.url(file)
    source = mirror_key(mirror)
    want = expected_hash(url, file.sha256, source, checksums_file)
    expected = want.sha256
    root = cache_dir / spec.cache_name
    target = root / file.path
    mirror_dir = local_mirror(mirror)
    hint = ""
    if want.origin.startswith("recorded"):
        where = "from upstream" if want.origin == "recorded" else f"from mirror {source}"
        hint = (f" (hash recorded {where} in {checksums_file or 'pipeline/data/checksums.json'}; "
                "delete the entry if the file really changed)")
    if mirror_dir is not None:
        src = mirror_dir / file.path
        if expected and target.is_file() and file_sha256(target) == expected:
            actual = expected          # already in the cache, verified
        elif not src.is_file():
            raise DataError(f"data mirror {mirror_dir} has no {file.path}")
        else:
            try:
                actual = _copy_verified(src, target, expected)
            except DataError as err:
                raise DataError(f"{err}{hint}") from None
    else:
        import pooch  # imported here: checking params must not need it
        import requests

        if expected is None:
            target.unlink(missing_ok=True)   # bytes of unknown origin (e.g. a mirror's) never become upstream's
        base = mirror.rstrip("/") + "/" if mirror else spec.base_url
        fetcher = pooch.create(path=root, base_url=base, retry_if_failed=retries,
                               registry={file.path: f"sha256:{expected}" if expected else None})
        # Resumes from the bytes an interrupted attempt (or run) received, when the server allows.
        downloader = ResumableDownloader(partial_path(target), DOWNLOAD_TIMEOUT_S,
                                         progress=sys.stderr.isatty() if progress is None else progress)
        try:
            fetcher.fetch(file.path, downloader=downloader)
        except ValueError as err:      # pooch: hash mismatch (download already deleted)
            message = " ".join(str(err).split())
            raise DataError(f"{base}{file.path}: {message}{hint}") from None
        except (requests.RequestException, OSError) as err:
            message = " ".join(str(err).split())
            raise DataError(f"could not download {base}{file.path} after {retries + 1} attempt(s): {message}") from None
        actual = expected or file_sha256(target)
    if expected is None and record:
        record_checksum(url, actual, source, checksums_file)
    return target, actual, want.origin


def extract_tar(archive: Path, dest: Path, members: Iterable[str] | None = None) -> Path:
    """Extract ``members`` (all when None) of a tar archive (any compression) into ``dest``.

    Extraction uses tarfile's ``data`` filter, which rejects members that would land outside
    ``dest`` (``../`` paths, links pointing outside, device files). Members are extracted into
    a temporary directory beside ``dest`` in one streaming pass and each is then renamed into
    place, so ``dest`` only ever holds complete files; on any error nothing is moved.
    Member names are matched with any leading ``./`` removed.
    """
    wanted = None if members is None else {_norm_member(m) for m in members}
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.part-"))
    try:
        found: set[str] = set()
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                name = _norm_member(member.name)
                if wanted is not None and name not in wanted:
                    continue
                tar.extract(member, tmp, filter="data")
                found.add(name)
        if wanted is not None and wanted - found:
            raise DataError(f"{archive.name} has no member {sorted(wanted - found)[0]}")
        for path in sorted(tmp.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                continue
            target = dest / path.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    except tarfile.FilterError as err:
        raise DataError(f"{archive.name}: unsafe member rejected: {err}") from None
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DataError(f"{archive.name}: cannot extract: {' '.join(str(err).split())}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _norm_member(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name
