"""Preparing a data set's corpus: fetch and verify its files, read, clean and write plain text.

``prepare_corpus`` writes ``train.{src,tgt}``, ``{valid_set}.{src,tgt}``, ``{test}.{src,tgt}`` and
``stats.json`` into a temporary folder beside ``out_dir`` and puts it in place only when
everything succeeded, so a failed or interrupted run (bad hash, misaligned files, invalid
UTF-8, a network error) leaves the previous output untouched. ``stats.json`` holds only what
depends on the data (counts, source URLs and their sha256), never whether a hash was known
before: byte-identical text gives a byte-identical corpus, so DVC sees no change.

Incoming data
    ``data.incoming_dir`` (default ``data/incoming``) may hold new parallel data as pairs of
    plain UTF-8 files ``<name>.<src_lang>`` and ``<name>.<tgt_lang>``, one sentence a line. They
    are appended to the training split after the data set's own corpora, cleaned like them,
    not counted against ``limit_train_pairs``, and pairs whose source sentence is in the
    validation or a test set are dropped (``overlap``) so they cannot leak into the scores that
    decide a promotion. Each file is versioned with its own ``dvc add`` (a ``.dvc`` file beside
    it; the retraining flow does this), so the folder itself can stay in git with a README and a
    fresh clone without incoming data still runs; a ``.dvc`` file whose data is missing is an
    error (``dvc pull``). A missing folder means no incoming data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.data.checksums import record_checksum
from pipeline.data.fetch import DOWNLOAD_RETRIES, extract_tar, fetch_file, mirror_key
from pipeline.data.read import read_pairs
from pipeline.data.registry import check_data_params, get_spec
from pipeline.data.spec import TRAIN_SPLIT, Corpus, DataError, RemoteFile, Side
from transformer.atomic import atomic_dir, file_sha256, fsync_files

if TYPE_CHECKING:  # only the type: the params schema imports the registry; nothing here needs it at run time
    from pipeline.config.data import DataParams

Located = tuple[Corpus, tuple[Path, Side], tuple[Path, Side]]


def _clean_reason(src: str, tgt: str, max_words: int, max_ratio: float) -> str | None:
    if not src or not tgt:
        return "empty"
    ns, nt = len(src.split()), len(tgt.split())
    if max(ns, nt) > max_words:
        return "too_long"
    if max(ns, nt) / min(ns, nt) > max_ratio:
        return "ratio"
    return None


def _copy_clean(pairs: Iterable[tuple[str, str]], fs: Any, ft: Any, data: DataParams, dropped: dict[str, int],
                reject: Callable[[str, int], str | None]) -> tuple[int, int]:
    """Write the pairs that pass cleaning (and ``reject(src, kept so far)``) to ``fs``/``ft``;
    count the others in ``dropped`` by reason. Returns (raw pairs, kept pairs)."""
    raw = kept = 0
    for s, t in pairs:
        raw += 1
        reason = _clean_reason(s, t, data.max_words, data.max_ratio) or reject(s, kept)
        if reason is not None:
            dropped[reason] += 1
            continue
        fs.write(s + "\n")
        ft.write(t + "\n")
        kept += 1
    return raw, kept


def _write_train(data: DataParams, corpora: list[Located],
                 out: Path) -> dict[str, Any]:
    dropped = {"empty": 0, "too_long": 0, "ratio": 0, "limit": 0}
    raw = kept = 0
    per_corpus: dict[str, int] = {}
    with open(out / f"{TRAIN_SPLIT}.{data.src_lang}", "w", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{TRAIN_SPLIT}.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as ft:
        for corpus, src, tgt in corpora:
            limit = data.limit_train_pairs - kept
            # Past the limit, keep reading: raw counts and alignment cover the whole corpus.
            r, k = _copy_clean(read_pairs(src, tgt), fs, ft, data, dropped,
                               lambda s, done, limit=limit:
                               "limit" if data.limit_train_pairs and done >= limit else None)
            raw, kept = raw + r, kept + k
            per_corpus[corpus.name] = r
    if kept == 0:
        detail = ", ".join(f"{k} {v}" for k, v in dropped.items() if v)
        raise DataError(f"{TRAIN_SPLIT}: no sentence pairs left after cleaning "
                        f"({raw} raw pairs{'; dropped: ' + detail if detail else ''})")
    return {"raw": raw, "kept": kept, "dropped": dropped, "corpora": per_corpus}


def incoming_pairs(directory: Path, src_lang: str, tgt_lang: str) -> list[tuple[str, Path, Path]]:
    """``(name, source file, target file)`` of each pair in ``directory``, sorted by name.

    Files of other languages, hidden files and README-like files are ignored. A name with only
    one side of the pair, or a ``.dvc`` file whose data file is missing, raises ``DataError``.
    """
    if not directory.is_dir():
        return []
    sides: dict[str, dict[str, Path]] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        if path.suffix == ".dvc":
            tracked = path.with_suffix("")
            if not tracked.exists():
                raise DataError(f"{tracked} is versioned by DVC ({path.name}) but missing: run dvc pull")
            continue
        name, dot, lang = path.name.rpartition(".")
        if dot and name and lang in (src_lang, tgt_lang) and path.is_file():
            sides.setdefault(name, {})[lang] = path
    pairs = []
    for name, found in sorted(sides.items()):
        for lang in (src_lang, tgt_lang):
            if lang not in found:
                raise DataError(f"{directory / f'{name}.{lang}'} is missing: incoming data comes in pairs "
                                f"<name>.{src_lang} and <name>.{tgt_lang}")
        pairs.append((name, found[src_lang], found[tgt_lang]))
    return pairs


def _append_incoming(data: DataParams, pairs: list[tuple[str, Path, Path]], out: Path,
                     held_out: set[str]) -> dict[str, Any]:
    """Append the cleaned incoming pairs to ``out``'s training files; per-pair and dropped counts."""
    dropped = {"empty": 0, "too_long": 0, "ratio": 0, "overlap": 0}
    per_pair: dict[str, dict[str, Any]] = {}
    with open(out / f"{TRAIN_SPLIT}.{data.src_lang}", "a", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{TRAIN_SPLIT}.{data.tgt_lang}", "a", encoding="utf-8", newline="\n") as ft:
        for name, src, tgt in pairs:
            sides = ((src, Side(RemoteFile(str(src)))), (tgt, Side(RemoteFile(str(tgt)))))
            raw, kept = _copy_clean(read_pairs(*sides), fs, ft, data, dropped,
                                    lambda s, done: "overlap" if s in held_out else None)
            per_pair[name] = {"raw": raw, "kept": kept, "files": [str(src), str(tgt)],
                              "sha256": [file_sha256(src), file_sha256(tgt)]}
    return {"pairs": per_pair, "raw": sum(p["raw"] for p in per_pair.values()),
            "kept": sum(p["kept"] for p in per_pair.values()), "dropped": dropped}


def _write_eval(data: DataParams, split: str, corpora: list[Located],
                out: Path) -> dict[str, Any]:
    count = 0
    with open(out / f"{split}.{data.src_lang}", "w", encoding="utf-8", newline="\n") as fs, \
            open(out / f"{split}.{data.tgt_lang}", "w", encoding="utf-8", newline="\n") as ft:
        for _, src, tgt in corpora:
            for number, (s, t) in enumerate(read_pairs(src, tgt), 1):
                for text, side in ((s, src[1]), (t, tgt[1])):
                    if not text:
                        raise DataError(f"{split}: {side.label} sentence {number} is empty "
                                        "(evaluation sets are not filtered)")
                fs.write(s + "\n")
                ft.write(t + "\n")
                count += 1
    if count == 0:
        raise DataError(f"{split}: the evaluation set has no sentences")
    return {"raw": count, "kept": count, "dropped": {"empty": 0, "too_long": 0, "ratio": 0, "limit": 0}}


def prepare_corpus(
    data: DataParams,
    out_dir: Path,
    cache_dir: Path,
    *,
    checksums_file: Path | None = None,
    retries: int = DOWNLOAD_RETRIES,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Fetch, verify and clean ``data.dataset`` into plain UTF-8 text files in ``out_dir``.

    Writes ``train.{src,tgt}`` (cleaned: stripped; pairs with an empty side, a side over
    ``max_words`` words or a word-count ratio over ``max_ratio`` dropped; the first
    ``limit_train_pairs`` kept when > 0; then the pairs of ``data.incoming_dir``, see the
    module docstring), ``{valid_set}.{src,tgt}`` and ``{test}.{src,tgt}``
    (whole, unfiltered; an empty line is an error) and ``stats.json``, whose content is also
    returned. Everything is written into a temporary directory beside ``out_dir`` that
    replaces it only at the end. Downloads are verified (see the module docstring) before
    they are read. Raises ``DataError`` with a one-line message on any data problem.
    """
    spec = get_spec(data.dataset)
    try:
        check_data_params(data.dataset, data.src_lang, data.tgt_lang, data.valid_set, data.test_sets)
    except ValueError as err:
        raise DataError(str(err)) from None
    src_lang, tgt_lang = data.src_lang, data.tgt_lang
    splits = [TRAIN_SPLIT, data.valid_set] + [s for s in data.test_sets if s != data.valid_set]
    mirror = data.resolved_mirror()
    incoming_dir = Path(data.incoming_dir) if data.incoming_dir else None
    incoming = incoming_pairs(incoming_dir, src_lang, tgt_lang) if incoming_dir else []

    # 1. fetch and verify every file the splits need (archives once, however many members)
    needed: dict[RemoteFile, set[str]] = {}
    for split in splits:
        for corpus in spec.splits[split]:
            for lang in (src_lang, tgt_lang):
                if lang in corpus.unverified:
                    print(f"warning: {spec.name} {split} {lang}: this side is not confirmed upstream; "
                          "if its download fails, choose another split", file=sys.stderr)
                side = corpus.sides[lang]
                needed.setdefault(side.file, set())
                if side.member:
                    needed[side.file].add(side.member)
    local: dict[tuple[RemoteFile, str | None], Path] = {}
    sources = []
    first_seen = []
    source = mirror_key(mirror)
    for file, members in needed.items():
        path, digest, origin = fetch_file(spec, file, cache_dir, mirror, checksums_file=checksums_file,
                                          retries=retries, progress=progress, record=False)
        sources.append({"url": spec.url(file), "sha256": digest})
        if origin == "first-download":
            first_seen.append((spec.url(file), digest))
        print(f"{spec.url(file)}: sha256 {digest[:12]}... ({origin})")
        local[(file, None)] = path
        if members:
            dest = cache_dir / spec.cache_name / "extracted" / f"{file.path}.{digest[:12]}"
            missing = [m for m in sorted(members) if not (dest / m).is_file()]
            if missing:
                extract_tar(path, dest, missing)
            for member in members:
                local[(file, member)] = dest / member

    def located(side: Side) -> tuple[Path, Side]:
        return local[(side.file, side.member)], side

    # 2. read, check and write into a temporary directory beside out_dir
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(out_dir) as tmp:
        split_stats: dict[str, Any] = {}
        for split in splits:
            corpora = [(c, located(c.sides[src_lang]), located(c.sides[tgt_lang])) for c in spec.splits[split]]
            if split == TRAIN_SPLIT:
                stats = _write_train(data, corpora, tmp)
            else:
                stats = _write_eval(data, split, corpora, tmp)
            stats["files"] = [f"{split}.{src_lang}", f"{split}.{tgt_lang}"]
            split_stats[split] = stats
        incoming_stats = None
        if incoming:
            held_out = {line for split in splits[1:]
                        for line in (tmp / f"{split}.{src_lang}").read_text(encoding="utf-8").split("\n")}
            incoming_stats = _append_incoming(data, incoming, tmp, held_out)
            train = split_stats[TRAIN_SPLIT]
            train["raw"] += incoming_stats["raw"]
            train["kept"] += incoming_stats["kept"]
            for reason, count in incoming_stats["dropped"].items():
                train["dropped"][reason] = train["dropped"].get(reason, 0) + count
            for name, pair in incoming_stats["pairs"].items():
                train["corpora"][f"incoming/{name}"] = pair["raw"]
        result = {
            "dataset": spec.name,
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "valid_set": data.valid_set,
            "test_sets": list(data.test_sets),
            "cleaning": {"max_words": data.max_words, "max_ratio": data.max_ratio,
                         "limit_train_pairs": data.limit_train_pairs},
            "splits": split_stats,
            "sources": sources,
            "incoming": {"dir": data.incoming_dir, **(incoming_stats or {"pairs": {}, "raw": 0, "kept": 0})},
        }
        (tmp / "stats.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        fsync_files(tmp)
    # Trust on first use, recorded only now: a download that turned out truncated or unreadable
    # (a broken archive, misaligned files) must not become the reference for every later run.
    for url, digest in first_seen:
        record_checksum(url, digest, source, checksums_file)
    return result
