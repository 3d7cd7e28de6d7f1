"""Reading the pipeline's text files (corpus splits, translations, references): UTF-8, one item a line.

Writing goes through ``transformer.atomic`` (temporary file, then rename).
"""

from __future__ import annotations

import os


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, without their line endings."""
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
