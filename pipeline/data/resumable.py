"""HTTP downloads that continue where an interrupted transfer stopped, when the server allows.

Large archives (WMT14's are gigabytes) must not start over after a dropped connection. The
bytes received so far are kept in a partial file beside the target; the next attempt (pooch's
retry, or the next run of the download stage) asks for the rest with an HTTP Range request.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import IO, Any

CHUNK_BYTES = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def partial_path(target: Path) -> Path:
    """Where the bytes of an unfinished download of ``target`` are kept (hidden, beside it)."""
    return target.with_name(f".{target.name}.part")


class ResumableDownloader:
    """A pooch downloader (``downloader(url, output_file, pooch)``) that resumes.

    It streams into ``partial`` and, when that file already holds bytes, asks only for the
    rest (``Range: bytes=<held>-``). A 206 answer whose Content-Range starts at the held size is
    appended; any other answer (200: the server ignores ranges; 416: the held bytes do not fit
    the file) starts again from byte 0. A transfer cut short raises ``requests``' exceptions,
    which pooch retries, and leaves the bytes received in ``partial``. A complete transfer is
    moved to pooch's output file: pooch then checks its hash and deletes it on a mismatch, so a
    tampered file is never resumed from.
    """

    def __init__(self, partial: Path, timeout: float, progress: bool = False) -> None:
        self.partial, self.timeout, self.progress = Path(partial), timeout, progress

    def _held(self) -> int:
        return self.partial.stat().st_size if self.partial.is_file() else 0

    def __call__(self, url: str, output_file: str | IO[bytes], pooch: Any = None) -> None:
        import requests
        import urllib3

        self.partial.parent.mkdir(parents=True, exist_ok=True)
        held = self._held()
        headers = {"Range": f"bytes={held}-"} if held else {}
        with requests.get(url, headers=headers, stream=True, timeout=self.timeout) as response:
            if held and response.status_code == 416:   # the held bytes are not a prefix of this file
                self.partial.unlink()
                return self(url, output_file, pooch)
            response.raise_for_status()
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
            resumed = bool(held and response.status_code == 206 and match and int(match.group(1)) == held)
            if resumed:
                total = int(match.group(3)) if match.group(3) != "*" else None
            else:
                held = 0
                length = response.headers.get("Content-Length")
                total = int(length) if length and "Content-Encoding" not in response.headers else None
            with open(self.partial, "ab" if resumed else "wb") as f, self._bar(total, held) as bar:
                while True:
                    # read1: whatever has arrived, so a cut connection keeps every byte received
                    # (iter_content drops the chunk it was filling).
                    try:
                        chunk = response.raw.read1(CHUNK_BYTES, decode_content=True)
                    except urllib3.exceptions.HTTPError as err:
                        raise requests.exceptions.ConnectionError(f"{url}: {err}") from err
                    if not chunk:
                        break
                    f.write(chunk)
                    bar.update(len(chunk))
        size = self._held()
        if total is not None and size != total:
            raise requests.exceptions.ConnectionError(f"{url}: transfer ended at byte {size} of {total}")
        if isinstance(output_file, (str, os.PathLike)):
            os.replace(self.partial, output_file)
        else:
            with open(self.partial, "rb") as f:
                shutil.copyfileobj(f, output_file)
            self.partial.unlink()

    def _bar(self, total: int | None, initial: int) -> Any:
        if self.progress:
            try:
                from tqdm import tqdm

                return tqdm(total=total, initial=initial, unit="B", unit_scale=True, leave=False)
            except ImportError:
                pass
        return _NoBar()


class _NoBar:
    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int) -> None:
        return None
