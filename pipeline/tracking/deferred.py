"""Stage records that wait for the tracking server instead of being lost.

A later stage's record (average, tune, evaluate: the run lookup by content hash, params, metrics,
artifacts, the pyfunc model and its registration) is data plus files, handed to ``submit``. It is
sent at once when nothing waits before it and the store answers; otherwise it joins the unsent
queue (``unsent``) with copies of its files (the model pinned by its sha256), and ``replay`` sends
it later, in order, after the training runs' own unsent metrics and tags: from the next stage,
``make push`` or ``python -m pipeline.tracking.replay``. A record that fails half-way keeps what it
did (``progress``: its run, its registered version) so that a replay never registers twice.

The senders live in ``pipeline.tracking.records.<stage>``, imported by name here so that a stage's
code (and its DVC deps) holds only its own sender; a replay may run another stage's.
"""

from __future__ import annotations

import hashlib
import importlib
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline.tracking import unsent
from pipeline.tracking.store import safe_uri, tracking_uri
from pipeline.tracking.unsent import SPOOL_DIR, UNSENT_FILE

SENT_BY = "the next stage, make push or python -m pipeline.tracking.replay"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _sender(stage: str) -> Any:
    return importlib.import_module(f"pipeline.tracking.records.{stage}")


def _send(record: dict[str, Any], files: Mapping[str, Path]) -> None:
    """Run the record's sender; raises whatever the store raised (the record then waits)."""
    _sender(record["stage"]).send(record["data"], files, record["progress"])


def _pin(record: dict[str, Any], files: Mapping[str, Path], pinned: Mapping[str, str]) -> None:
    """Copy the record's files into its own folder of the spool; ``pinned`` files (name -> sha256)
    must still hold that content, else the record is refused rather than sending another file."""
    folder = SPOOL_DIR / record["id"]
    folder.mkdir(parents=True, exist_ok=True)
    copied = {}
    for name, path in files.items():
        path = Path(path)
        if not path.exists():
            continue
        target = folder / name
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True)
        else:
            shutil.copy2(path, target)
        if name in pinned and _sha256(target) != pinned[name]:
            shutil.rmtree(folder, ignore_errors=True)
            raise ValueError(f"{path} changed before it could be kept (sha256 is no longer {pinned[name][:12]})")
        copied[name] = str(target.relative_to(SPOOL_DIR))
    record["files"], record["pinned"] = copied, dict(pinned)


def _spooled(record: dict[str, Any]) -> dict[str, Path]:
    """The record's kept files; a pinned one whose content changed on disk is an error, never sent."""
    files = {name: SPOOL_DIR / relative for name, relative in record.get("files", {}).items()}
    for name, sha in record.get("pinned", {}).items():
        if name in files and _sha256(files[name]) != sha:
            raise ValueError(f"{files[name]} is not the file kept (sha256 {sha[:12]}): edited by hand?")
    return files


def submit(sender: ModuleType, data: dict[str, Any], files: Mapping[str, Path] | None = None,
           pinned: Mapping[str, str] | None = None, registers: str | None = None) -> None:
    """Send a stage's record now, or keep it in the queue when something waits before it or the store
    fails; never raises. ``sender``: the stage's module of ``pipeline.tracking.records`` (imported by
    the stage itself, so that its DVC deps name it); ``files``: name -> file or folder the sender
    reads; ``pinned``: name -> sha256 of those that must be sent as they are (the model);
    ``registers``: the registered model's name when the record registers a version (the waiting
    line says so)."""
    stage = sender.__name__.rsplit(".", 1)[-1]
    record = {"id": uuid.uuid4().hex[:12], "stage": stage, "data": data, "progress": {},
              "registers": registers, "model_sha256": data.get("model_sha256")}
    files = dict(files or {})
    with unsent.locked():
        replay(quiet=True)
        doc = unsent.load()
        reason = "earlier records wait" if unsent.waiting(doc) else ""
        if not reason:
            try:
                _send(record, files)
            except Exception as err:   # the store away, refusing or failing: the record waits
                reason = f"{type(err).__name__}: {str(err)[:200]}"
        if reason:
            try:
                _pin(record, files, pinned or {})
            except (OSError, ValueError) as err:
                print(f"error: MLflow: the {stage} record could not be kept ({err}); it is lost", file=sys.stderr)
                return
            record["reason"] = reason
            doc = unsent.load()
            doc["records"].append(record)
            unsent.save(doc)
        print_waiting(doc if reason else None)


def replay(quiet: bool = False) -> int:
    """Send what waits, in order: the runs' unsent metrics and tags, then the stage records; stops at
    the first record that fails (those after it may need it: a tune record finds its run through the
    average record's link). Returns how many things still wait."""
    from pipeline.tracking.buffer import replay_unsent

    if not UNSENT_FILE.is_file():   # nothing waits: no lock taken, so no lock file left behind
        return 0
    with unsent.locked():
        runs_left = replay_unsent(quiet=quiet)
        doc = unsent.load()
        if runs_left or not doc["records"]:
            return runs_left + len(doc["records"])
        while doc["records"]:
            record = doc["records"][0]
            try:
                _send(record, _spooled(record))
            except Exception as err:   # still away (or refusing): kept, with what it already did
                record["reason"] = f"{type(err).__name__}: {str(err)[:200]}"
                if not quiet:
                    print(f"warning: MLflow: the waiting {record['stage']} record could not be sent yet "
                          f"({record['reason']})", file=sys.stderr, flush=True)
                break
            doc["records"].pop(0)
            print(f"MLflow: sent the {record['stage']} record that waited in {UNSENT_FILE}"
                  + (f" (registered {record['registers']!r} version {record['progress']['version']})"
                     if record["progress"].get("version") else ""), flush=True)
        unsent.save(doc)
        return len(doc["records"])


def describe(doc: Mapping[str, Any]) -> str:
    """What waits, in a few words: runs' metrics, stage records and the registrations among them."""
    parts = []
    if doc["runs"]:
        parts.append(f"metrics/tags of run(s) {', '.join(r[:8] for r in doc['runs'])}")
    records = doc["records"]
    if records:
        stages = ", ".join(r["stage"] for r in records)
        parts.append(f"the {stages} record(s)")
        for r in records:
            if r.get("registers") and not r["progress"].get("version"):
                parts.append(f"the registration of {r['registers']!r} for models/model.pt "
                             f"(sha256 {str(r.get('model_sha256'))[:12]})")
    return "; ".join(parts)


def print_waiting(doc: Mapping[str, Any] | None = None) -> None:
    """One line on stderr saying what waits for the tracking server, when anything does."""
    doc = doc if doc is not None else unsent.load()
    if unsent.waiting(doc):   # type: ignore[arg-type]
        print(f"warning: MLflow: waiting in {UNSENT_FILE} for {safe_uri(tracking_uri())}: {describe(doc)}; "
              f"sent by {SENT_BY}", file=sys.stderr, flush=True)


def pending_registration(model_sha256: str, root: Path = Path(".")) -> dict[str, Any] | None:
    """The waiting record that is to register the model of ``model_sha256`` in ``root``'s queue, if any
    (the promotion gate's "no challenger yet")."""
    import json

    file = root / UNSENT_FILE
    try:
        records = json.loads(file.read_text()).get("records") or []
    except (OSError, ValueError, AttributeError):
        return None
    return next((r for r in records if r.get("registers") and r.get("model_sha256") == model_sha256
                 and not (r.get("progress") or {}).get("version")), None)
