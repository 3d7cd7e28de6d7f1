"""Recorded sha256 of upstream files that publish none (trust on first use), and where each came from.

``checksums.json`` (beside this module; **commit it** after the first download of a new file)
keeps two kinds of record:

- ``sha256``: ``upstream URL -> hash`` of files downloaded from the upstream URL itself. They
  check every later download, from upstream or from any mirror (a mirror is a copy of upstream:
  a mirror file that differs from upstream's recorded bytes is refused).
- ``mirror_sha256``: ``mirror -> {upstream URL -> hash}`` of files first seen through a mirror
  (``DATA_MIRROR``). They check only later reads from that same mirror: a repacked archive in a
  mirror never becomes the reference the real upstream file is checked against.

Published hashes (in the registry) win over both. The file is rewritten atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.data.spec import DataError
from transformer.atomic import write_text

# DATA_CHECKSUMS names another file (benchmarks and scratch runs keep the repository's record clean).
CHECKSUMS_FILE = Path(os.environ.get("DATA_CHECKSUMS") or Path(__file__).with_name("checksums.json"))
UPSTREAM = ""   # the ``source`` of a download from the upstream URL (else the mirror's key)
COMMENT = ("sha256 of upstream files that publish none, recorded on first download by pipeline/data/checksums.py "
           "and checked on every later use. 'sha256': downloaded from the upstream URL; 'mirror_sha256': first "
           "seen through that mirror, checked only against it. Commit this file.")


@dataclass(frozen=True)
class Expected:
    """The hash a download must have and where it comes from: ``published`` (the registry),
    ``recorded`` (from upstream), ``recorded-mirror`` (from this mirror) or ``first-download`` (none)."""

    sha256: str | None
    origin: str


def _path(path: Path | None) -> Path:
    return CHECKSUMS_FILE if path is None else path


def load_records(path: Path | None = None) -> dict[str, dict]:
    """``{"sha256": {url: hash}, "mirror_sha256": {mirror: {url: hash}}}`` from the checksums file."""
    path = _path(path)
    if not path.is_file():
        return {"sha256": {}, "mirror_sha256": {}}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        upstream, mirrors = document.get("sha256", {}), document.get("mirror_sha256", {})
    except (ValueError, AttributeError) as err:
        raise DataError(f"{path} is not a valid checksums file: {err}") from None
    if not isinstance(upstream, dict) or not isinstance(mirrors, dict) or \
            not all(isinstance(v, dict) for v in mirrors.values()):
        raise DataError(f"{path}: 'sha256' must map URLs to hashes and 'mirror_sha256' mirrors to such maps")
    return {"sha256": upstream, "mirror_sha256": mirrors}


def load_checksums(path: Path | None = None) -> dict[str, str]:
    """Hashes recorded from upstream, by upstream URL; {} if the file is absent."""
    return load_records(path)["sha256"]


def expected_hash(url: str, published: str | None, source: str = UPSTREAM, path: Path | None = None) -> Expected:
    """What the file at ``url`` must hash to when read from ``source`` (``UPSTREAM`` or a mirror key)."""
    if published:
        return Expected(published, "published")
    records = load_records(path)
    if url in records["sha256"]:
        return Expected(records["sha256"][url], "recorded")
    if source != UPSTREAM and url in records["mirror_sha256"].get(source, {}):
        return Expected(records["mirror_sha256"][source][url], "recorded-mirror")
    return Expected(None, "first-download")


def record_checksum(url: str, sha256: str, source: str = UPSTREAM, path: Path | None = None) -> None:
    """Record ``url -> sha256`` as seen from ``source``: under ``sha256`` for upstream, under
    ``mirror_sha256[source]`` for a mirror. Written atomically."""
    path = _path(path)
    records = load_records(path)
    if source == UPSTREAM:
        records["sha256"][url] = sha256
    else:
        records["mirror_sha256"].setdefault(source, {})[url] = sha256
    document: dict = {"comment": COMMENT, "sha256": dict(sorted(records["sha256"].items()))}
    mirrors = {m: dict(sorted(v.items())) for m, v in sorted(records["mirror_sha256"].items()) if v}
    if mirrors:
        document["mirror_sha256"] = mirrors
    write_text(path, json.dumps(document, indent=2) + "\n")
