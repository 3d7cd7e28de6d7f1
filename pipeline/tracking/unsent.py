"""The unsent queue on disk: ``reports/mlflow_unsent.json`` (git-ignored, no DVC output) holds what
could not reach the tracking store, in the order it happened:

- ``runs``: per run id, the metric values, tags and end status a training's background logger
  could not send (``buffer``);
- ``records``: whole stage records (average, tune, evaluate: metrics, artifacts, the model and its
  registration) that waited for the server (``deferred``), their files copied beside it into
  ``reports/mlflow_unsent/<record id>/`` so that a later run cannot change what they will send.

Every read-modify-write happens under one file lock (``locked``), so that two processes (a stage
and ``make push``) never replay the same thing twice or drop what the other added.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformer.atomic import write_json

UNSENT_FILE = Path("reports/mlflow_unsent.json")
SPOOL_DIR = Path("reports/mlflow_unsent")   # the records' pinned files, and the lock
LOCK_FILE = SPOOL_DIR / "lock"

_held = 0   # nesting depth of ``locked`` in this process (flock on a second descriptor would wait on itself)


@contextmanager
def locked() -> Iterator[None]:
    """Hold the queue's lock (blocking): one reader-writer of the queue at a time, across processes."""
    global _held
    if _held:
        _held += 1
        try:
            yield
        finally:
            _held -= 1
        return
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)   # released when the descriptor closes, also by a killed process
        _held = 1
        try:
            yield
        finally:
            _held = 0


def load() -> dict[str, Any]:
    """The queue: {"runs": {run id: {...}}, "records": [...]}, empty parts when there is no file."""
    doc: dict[str, Any] = {"runs": {}, "records": []}
    if not UNSENT_FILE.is_file():
        return doc
    try:
        loaded = json.loads(UNSENT_FILE.read_text())
        doc["runs"] = dict(loaded.get("runs") or {})
        doc["records"] = list(loaded.get("records") or [])
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):   # written atomically: a hand edit
        print(f"warning: {UNSENT_FILE} is not the unsent-queue file this version writes; left as it is",
              file=sys.stderr)
    return doc


def save(doc: dict[str, Any]) -> None:
    """Write the queue back (atomically); an empty queue removes the file and the records' copies."""
    runs, records = doc.get("runs") or {}, doc.get("records") or []
    if runs or records:
        write_json(UNSENT_FILE, {"runs": runs, "records": records})
    else:
        UNSENT_FILE.unlink(missing_ok=True)
    keep = {record["id"] for record in records}
    if SPOOL_DIR.is_dir():
        for folder in SPOOL_DIR.iterdir():
            if folder.is_dir() and folder.name not in keep:   # a record sent: its copies go
                shutil.rmtree(folder, ignore_errors=True)


def waiting(doc: dict[str, Any] | None = None) -> bool:
    """Whether anything waits in the queue."""
    doc = doc if doc is not None else load()
    return bool(doc["runs"] or doc["records"])
