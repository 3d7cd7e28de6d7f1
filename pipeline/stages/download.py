"""DVC stage ``download``: fetch, verify and clean the corpus named in ``params.yaml`` (section data).

    python -m pipeline.stages.download

Writes ``data/corpus/`` (plain text, one sentence a line, plus ``stats.json``) and keeps the
verified downloads in ``data/cache/``. A bad parameter or a data problem (hash mismatch,
misaligned or invalid files) prints one ``error: ...`` line to stderr and exits 2.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.loader import load_sections
from pipeline.data.corpus import prepare_corpus
from pipeline.stages.runner import run_stage


def format_table(stats: dict[str, Any]) -> str:
    """The per-split counts of ``prepare_corpus``'s stats as a short fixed-width table."""
    rows = [("split", "raw", "kept", "empty", "too_long", "ratio", "limit")]
    for split, s in stats["splits"].items():
        d = s["dropped"]
        rows.append((split, s["raw"], s["kept"], d["empty"], d["too_long"], d["ratio"], d["limit"]))
    width = max(len(str(r[0])) for r in rows)
    return "\n".join(f"{r[0]!s:<{width}}" + "".join(f"{v!s:>10}" for v in r[1:]) for r in rows)


def main() -> None:
    data = load_sections(DataParams).data
    stats = prepare_corpus(data, paths.CORPUS_DIR, paths.DOWNLOAD_CACHE)
    print(f"{stats['dataset']} {data.pair} -> {paths.CORPUS_DIR}/")
    print(format_table(stats))


if __name__ == "__main__":
    run_stage(main)
