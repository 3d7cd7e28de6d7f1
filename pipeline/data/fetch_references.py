"""Fetching the literature's tokenized references (``pipeline.data.references``) for the references
stage: each verified by sha256 like the raw files (``pipeline.data.fetch``), written with a manifest
into ``data/references/``, replaced whole only once everything succeeded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.fetch import fetch_file
from pipeline.data.references import MANIFEST, MULTI30K_TOK_SPEC, reference_file
from pipeline.data.spec import DataError
from transformer.atomic import atomic_dir, fsync_files

if TYPE_CHECKING:  # the type only: nothing here needs the params schema at run time
    from pipeline.config.data import DataParams


def write_references(data: DataParams, out_dir: Path, cache_dir: Path, *,
                     checksums_file: Path | None = None) -> dict[str, Any]:
    """Fetch and verify the tokenized references of ``data.valid_set`` and ``data.test_sets`` in
    ``data.tgt_lang`` (downloads kept in ``cache_dir``) and write them as ``<split>.<tgt_lang>`` with
    ``manifest.json`` into ``out_dir`` (replaced whole, only once everything succeeded). Returns the manifest."""
    mirror = data.resolved_mirror()
    sets: dict[str, dict[str, Any]] = {}
    texts: dict[str, bytes] = {}
    for split in [data.valid_set, *data.test_sets]:
        remote = reference_file(data.dataset, split, data.tgt_lang)
        if remote is None:
            continue
        path, digest, origin = fetch_file(MULTI30K_TOK_SPEC, remote, cache_dir, mirror, checksums_file=checksums_file)
        raw = path.read_bytes()
        try:
            lines = raw.decode("utf-8").rstrip("\n").split("\n")
        except UnicodeDecodeError as err:
            raise DataError(f"{remote.path}: not UTF-8 ({err})") from None
        print(f"{MULTI30K_TOK_SPEC.url(remote)}: sha256 {digest[:12]}... ({origin}), {len(lines)} lines")
        texts[f"{split}.{data.tgt_lang}"] = raw
        sets[split] = {"file": f"{split}.{data.tgt_lang}", "url": MULTI30K_TOK_SPEC.url(remote), "sha256": digest,
                       "lines": len(lines)}
    manifest = {"dataset": data.dataset, "tgt_lang": data.tgt_lang, "sets": sets}
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir) as tmp:
        for name, raw in texts.items():
            (tmp / name).write_bytes(raw)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        fsync_files(tmp)
    return manifest
