"""Small atomic writers for reports and text outputs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformer.checkpoint import atomic_write


def write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | os.PathLike, value: Any) -> None:
    write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_lines(path: str | os.PathLike, lines: Iterable[str]) -> None:
    write_text(path, "".join(f"{line}\n" for line in lines))


def read_lines(path: str | os.PathLike) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
