"""DVC stage ``references``: the literature's tokenized references of the validation and test sets.

    python -m pipeline.stages.references

Writes ``data/references/`` (``pipeline.data.fetch_references``): for Multi30k, upstream's
``lc.norm.tok`` files of ``data.valid_set`` and ``data.test_sets`` in ``data.tgt_lang``, verified by
sha256, and ``manifest.json``; for other data sets the manifest alone. The tune and evaluate stages
score against them (``bleu_lc_tok``, ``pipeline.scoring.literature_bleu``). Apart from download so
that a new reference file never reruns the tokenizer and training. A data problem prints one
``error: ...`` line and exits 2.
"""

from __future__ import annotations

from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.loader import load_sections
from pipeline.data.fetch_references import write_references
from pipeline.data.references import REFERENCES_DIR
from pipeline.stages.runner import run_stage


def main() -> None:
    data = load_sections(DataParams).data
    manifest = write_references(data, REFERENCES_DIR, paths.DOWNLOAD_CACHE)
    sets = ", ".join(manifest["sets"]) or f"none ({data.dataset} publishes no tokenized references)"
    print(f"literature references ({data.tgt_lang}) -> {REFERENCES_DIR}/: {sets}")


if __name__ == "__main__":
    run_stage(main)
