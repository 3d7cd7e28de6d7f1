"""The unsent queue on disk: ``reports/mlflow_unsent.json`` (git-ignored, no DVC output) of the
repository holds what could not reach the tracking store, in the order it happened:

- ``runs``: per run id, the metric values, tags and end status a training's background logger
  could not send (``buffer``);
- ``records``: whole stage records (average, tune, evaluate: metrics, artifacts, the model and its
  registration) that waited for the server (``deferred``), their files copied beside it into
  ``reports/mlflow_unsent/<record id>/`` so that a later run cannot change what they will send;
- ``set_aside``: records (and runs' leftovers) that failed for another reason than the server
  being away, with the reason, and those that depend on them (``deferred``): kept, not retried,
  until ``python -m pipeline.tracking.replay --retry ID`` or ``--drop ID``.

The files lie in the repository's root (the folder holding ``.dvc``), found from any folder of it
and from DVC's temporary experiment workspaces (``<root>/.dvc/tmp/exps/...``, deleted after their
run: ``dvc exp run --temp``, queued experiments), so that what waits outlives the workspace.

Every read-modify-write happens under one file lock (``locked``), so that two processes (a stage
and ``make push``) never replay the same thing twice or drop what the other added.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformer.atomic import write_json

UNSENT_FILE = Path("reports/mlflow_unsent.json")   # under the repository's root
SPOOL_DIR = Path("reports/mlflow_unsent")   # the records' pinned files, and the lock
HANDLED_BY = "python -m pipeline.tracking.replay --list shows why; --retry ID or --drop ID"


def repository_root(start: Path | None = None) -> Path:
    """The DVC repository the folder ``start`` (default: the working folder) belongs to: inside a
    repository's ``.dvc`` (a temporary experiment workspace of it), that repository; else the
    nearest folder holding ``.dvc``; else ``start`` itself."""
    here = (start or Path.cwd()).resolve()
    folders = (here, *here.parents)
    inside = next((f for f in folders if f.name == ".dvc"), None)
    if inside is not None:
        return repository_root(inside.parent)
    return next((f for f in folders if (f / ".dvc").is_dir()), here)


def queue_file() -> Path:
    return repository_root() / UNSENT_FILE


def spool_dir() -> Path:
    return repository_root() / SPOOL_DIR


def shown(path: Path) -> str:
    """``path`` as printed: relative to the working folder when under it (the usual case), else whole."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)

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
    lock = spool_dir() / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)   # released when the descriptor closes, also by a killed process
        _held = 1
        try:
            yield
        finally:
            _held = 0


def load() -> dict[str, Any]:
    """The queue: {"runs": {run id: {...}}, "records": [...], "set_aside": [...]}, empty parts when
    there is no file."""
    doc: dict[str, Any] = {"runs": {}, "records": [], "set_aside": []}
    file = queue_file()
    if not file.is_file():
        return doc
    try:
        loaded = json.loads(file.read_text())
        doc["runs"] = dict(loaded.get("runs") or {})
        doc["records"] = list(loaded.get("records") or [])
        doc["set_aside"] = list(loaded.get("set_aside") or [])
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):   # written atomically: a hand edit
        print(f"warning: {shown(file)} is not the unsent-queue file this version writes; left as it is",
              file=sys.stderr)
    return doc


def save(doc: dict[str, Any]) -> None:
    """Write the queue back (atomically); an empty queue removes the file, and a record's copies go
    once it is neither waiting nor set aside."""
    runs, records, aside = doc.get("runs") or {}, doc.get("records") or [], doc.get("set_aside") or []
    file, spool = queue_file(), spool_dir()
    if runs or records or aside:
        write_json(file, {"runs": runs, "records": records, "set_aside": aside})
    else:
        file.unlink(missing_ok=True)
    keep = {record["id"] for record in (*records, *aside)}
    if spool.is_dir():
        for folder in spool.iterdir():
            if folder.is_dir() and folder.name not in keep:   # a record sent or dropped: its copies go
                shutil.rmtree(folder, ignore_errors=True)


def waiting(doc: dict[str, Any] | None = None) -> bool:
    """Whether anything waits in the queue to be sent (what is set aside does not)."""
    doc = doc if doc is not None else load()
    return bool(doc["runs"] or doc["records"])


def set_aside(doc: dict[str, Any], entry: dict[str, Any], reason: str, held_by: str | None = None) -> None:
    """Move ``entry`` to the queue's ``set_aside`` list with why (``held_by``: the set-aside entry it needs)."""
    entry["reason"] = reason
    entry["held_by"] = held_by
    entry["set_aside_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    doc["set_aside"].append(entry)


def entry_name(entry: Mapping[str, Any]) -> str:
    """A queue entry in a few words: ``tune record 0123abcd4567``, ``leftovers of run <id>``."""
    if entry["stage"] == "run":
        return f"leftovers of run {entry['run_id']}"
    return f"{entry['stage']} record {entry['id']}"


def print_set_aside(entry: Mapping[str, Any]) -> None:
    """The warning line for an entry just set aside."""
    print(f"warning: MLflow: set aside the {entry_name(entry)} ({entry['reason']}); the others go on; {HANDLED_BY}",
          file=sys.stderr, flush=True)
