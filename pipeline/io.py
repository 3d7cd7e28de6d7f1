"""Reading text outputs; the atomic writers live in ``transformer.atomic`` (re-exported here)."""

from __future__ import annotations

import os

from transformer.atomic import atomic_write, write_json, write_lines, write_text

__all__ = ["atomic_write", "read_lines", "write_json", "write_lines", "write_text"]


def read_lines(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
