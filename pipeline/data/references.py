"""The literature's tokenized references: upstream files that published scores are computed against.

Multi30k publishes, beside its raw text, ``data/task1/tok/<split>.lc.norm.tok.<lang>`` (lowercased,
punctuation-normalized, Moses-tokenized by its ``scripts/task1-tokenize.sh``); papers score
Multi30k against these (``pipeline.scoring.literature_bleu``). The references stage
(``pipeline.data.fetch_references``) fetches those of the validation and test sets in the target
language, verified by sha256 like the raw files (published hash, else trust on first use in
checksums.json), into ``data/references/`` with a ``manifest.json`` naming each file's source and
hash. This module says which files exist and reads them back: the tune and evaluate stages run it,
not the downloader.

This module is apart from the data registry on purpose: the tokenizer and train stages run
``registry.py`` and ``multi30k.py``, and a new reference file or hash must not retrain a model. Data
sets without such references (WMT14, whose paper measure is ``bleu_tok_compound_split``) get an
empty manifest, and their reports no literature measure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.data.multi30k import SPEC as MULTI30K
from pipeline.data.spec import DataError, DatasetSpec, RemoteFile

REFERENCES_DIR = Path("data/references")   # the references stage's output (not in pipeline/config/paths.py:
                                           # every stage runs that module, and this folder is tune's and evaluate's)
MANIFEST = "manifest.json"
MULTI30K_TOK = "data/task1/tok/{split}.lc.norm.tok.{lang}"

# By file name under data/task1/tok/: published in shared/data/README.md for the local mirror's files
# (byte-identical to upstream at multi30k.MULTI30K_COMMIT); the others are checked against checksums.json
# (trust on first use).
MULTI30K_TOK_SHA256: dict[str, str] = {
    "test_2016_flickr.lc.norm.tok.de": "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    "test_2016_flickr.lc.norm.tok.en": "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "test_2016_flickr.lc.norm.tok.fr": "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    "val.lc.norm.tok.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "val.lc.norm.tok.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "val.lc.norm.tok.fr": "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
}
# Splits and languages task1-tokenize.sh tokenized upstream (English, German, French); test_2018_flickr's
# references came later and Czech is not confirmed at the pinned commit: they get no literature measure.
MULTI30K_TOK_SPLITS: dict[str, tuple[str, ...]] = {
    "val": ("en", "de", "fr"),
    "test_2016_flickr": ("en", "de", "fr"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
}
# Where the reference files come from: the same base URL (and mirror layout) and download cache as
# the raw files (pipeline/data/multi30k.py's spec), so DATA_MIRROR serves both.
MULTI30K_TOK_SPEC = DatasetSpec(name="multi30k", description="Multi30k task 1 tokenized references",
                                base_url=MULTI30K.base_url, cache_name=MULTI30K.cache_name, splits={})


def reference_file(dataset: str, split: str, lang: str) -> RemoteFile | None:
    """The literature's tokenized reference of ``split`` in ``lang``, or None where there is none."""
    if dataset != "multi30k" or lang not in MULTI30K_TOK_SPLITS.get(split, ()):
        return None
    path = MULTI30K_TOK.format(split=split, lang=lang)
    return RemoteFile(path, MULTI30K_TOK_SHA256.get(path.rsplit("/", 1)[-1]))


def load_manifest(out_dir: Path = REFERENCES_DIR) -> Mapping[str, Any]:
    """The references stage's manifest; {} where the stage has not run (no literature measure)."""
    try:
        return json.loads((Path(out_dir) / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise DataError(f"{Path(out_dir) / MANIFEST} is not valid JSON: {err}") from None


def tokenized_references(split: str, out_dir: Path = REFERENCES_DIR) -> tuple[list[str], str] | None:
    """The literature's tokenized reference lines of ``split`` and their URL, or None where it has none."""
    entry = (load_manifest(out_dir).get("sets") or {}).get(split)
    if not entry:
        return None
    lines = (Path(out_dir) / entry["file"]).read_text(encoding="utf-8").rstrip("\n").split("\n")
    return lines, entry["url"]
