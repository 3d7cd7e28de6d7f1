"""Stage records that wait for the tracking server instead of being lost.

A later stage's record (average, tune, evaluate: the run lookup by content hash, params, metrics,
artifacts, the pyfunc model and its registration) is data plus files, handed to ``submit``. It is
sent at once when nothing waits before it and the store answers; otherwise it joins the unsent
queue (``on_disk``) with copies of its files (the model pinned by its sha256), and ``replay`` sends
it later, in order, after the training runs' own unsent metrics and tags: from the next stage,
``make push`` or ``python -m pipeline.tracking.replay``. A record that fails half-way keeps what it
did (``progress``: its run, its registered version) so that a replay never registers twice.

What a failure means (``failures``): refused credentials stop the command (exit 2, nothing queued:
no retry would send it); a server away keeps the record waiting, in order; any other failure sets
the record aside with its reason, together with the later records that need what it links (the
same run: ``links`` of each sender), and the others go on. ``python -m pipeline.tracking.replay
--list`` shows what is set aside, ``--retry ID`` and ``--drop ID`` handle it.

The senders live in ``pipeline.tracking.unsent.records.<stage>`` and, for the evaluate stage's record
(the registered pyfunc model), ``pipeline.pyfunc.evaluate_record`` (``SENDERS``), imported by name here
so that a stage's code (and its DVC deps) holds only its own sender; a replay may run another stage's.
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

from pipeline.tracking import failures
from pipeline.tracking.store import safe_uri, tracking_uri
from pipeline.tracking.unsent import on_disk
from pipeline.tracking.unsent.on_disk import HANDLED_BY, shown

SENT_BY = "the next stage, make push or python -m pipeline.tracking.replay"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Each stage's sender, by the stage a record names. A replay may run any of them, so they are named
# here and imported by name (a stage imports its own: its DVC deps hold no other stage's code). The
# evaluate record registers the pyfunc model, whose package sits above tracking's.
SENDERS = {"train": "pipeline.tracking.unsent.records.train", "average": "pipeline.tracking.unsent.records.average",
           "tune": "pipeline.tracking.unsent.records.tune", "evaluate": "pipeline.pyfunc.evaluate_record"}


def _sender(stage: str) -> Any:
    return importlib.import_module(SENDERS[stage])


def _send(record: dict[str, Any], files: Mapping[str, Path]) -> None:
    """Run the record's sender; raises whatever the store raised (the record then waits)."""
    _sender(record["stage"]).send(record["data"], files, record["progress"])


def _links(entry: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(sha256s the entry needs found on the server, sha256s it links there); a run's leftovers
    (``stage`` "run", set aside by ``buffer``) link its ``link.*`` tags."""
    if entry["stage"] == "run":
        return set(), {v for k, v in (entry["entry"].get("tags") or {}).items() if k.startswith("link.")}
    try:
        needs, provides = _sender(entry["stage"]).links(entry["data"])
    except (ImportError, AttributeError, KeyError, TypeError):   # a record this version cannot read
        return set(), set()
    return {s for s in needs if s}, {s for s in provides if s}


def _blocker(record: Mapping[str, Any], aside: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The set-aside entry that links something ``record`` needs, if any."""
    needs = _links(record)[0]
    return next((entry for entry in aside if needs & _links(entry)[1]), None)


def _pin(record: dict[str, Any], files: Mapping[str, Path], pinned: Mapping[str, str]) -> None:
    """Copy the record's files into its own folder of the spool; ``pinned`` files (name -> sha256)
    must still hold that content, else the record is refused rather than sending another file."""
    spool = on_disk.spool_dir()
    folder = spool / record["id"]
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
        copied[name] = str(target.relative_to(spool))
    record["files"], record["pinned"] = copied, dict(pinned)


def _spooled(record: dict[str, Any]) -> dict[str, Path]:
    """The record's kept files; a pinned one whose content changed on disk is an error, never sent."""
    spool = on_disk.spool_dir()
    files = {name: spool / relative for name, relative in record.get("files", {}).items()}
    for name, sha in record.get("pinned", {}).items():
        if name in files and (not files[name].is_file() or _sha256(files[name]) != sha):
            raise ValueError(f"{files[name]} is not the file kept (sha256 {sha[:12]}): edited or removed by hand?")
    return files


def submit(sender: ModuleType, data: dict[str, Any], files: Mapping[str, Path] | None = None,
           pinned: Mapping[str, str] | None = None, registers: str | None = None) -> None:
    """Send a stage's record now, or keep it in the queue when something waits before it or the store
    is away; set it aside when it fails otherwise or needs a set-aside record. Raises
    ``CredentialsRefused`` (401/403: nothing kept, the stage stops with one line), and ``ValueError``
    for a sender ``SENDERS`` does not name (a programming error, before anything is kept). ``sender``: the
    stage's sender module (``SENDERS``; imported by the stage itself, so that its DVC deps name it);
    ``files``: name -> file or folder the sender reads; ``pinned``: name -> sha256 of those that must
    be sent as they are (the model); ``registers``: the registered model's name when the record
    registers a version (the waiting line says so)."""
    stage = sender.STAGE
    if SENDERS.get(stage) != sender.__name__:   # a replay would not find it
        raise ValueError(f"{sender.__name__} is not the sender of stage {stage!r} in SENDERS")
    record = {"id": uuid.uuid4().hex[:12], "stage": stage, "data": data, "progress": {},
              "registers": registers, "model_sha256": data.get("model_sha256")}
    files = dict(files or {})
    with on_disk.locked():
        replay(quiet=True)
        doc = on_disk.load()
        blocker = _blocker(record, doc["set_aside"])
        reason, aside = "", False
        if blocker is not None:
            reason, aside = f"needs the set-aside {on_disk.entry_name(blocker)}", True
        elif on_disk.waiting(doc):
            reason = "earlier records wait"
        else:
            try:
                _send(record, files)
            except Exception as err:
                kind = failures.classify(err)
                if kind == failures.REFUSED:
                    raise failures.refusal(err) from None
                reason, aside = failures.reason(err), kind == failures.FAILED
        if reason:
            try:
                _pin(record, files, pinned or {})
            except (OSError, ValueError) as err:
                print(f"error: MLflow: the {stage} record could not be kept ({err}); it is lost", file=sys.stderr)
                return
            doc = on_disk.load()
            if aside:
                on_disk.set_aside(doc, record, reason, held_by=blocker["id"] if blocker else None)
                on_disk.print_set_aside(record)
            else:
                record["reason"] = reason
                doc["records"].append(record)
            on_disk.save(doc)
        print_waiting(doc if reason else None)


def _replay_records(doc: dict[str, Any], quiet: bool) -> None:
    """Send ``doc``'s waiting records in order (module docstring): stops at the first whose server
    is away; sets aside a record that fails otherwise and the later ones that need it."""
    records = doc["records"]
    while records:
        record = records[0]
        blocker = _blocker(record, doc["set_aside"])
        if blocker is not None:
            needs = f"needs the set-aside {on_disk.entry_name(blocker)}"
            on_disk.set_aside(doc, records.pop(0), needs, held_by=blocker["id"])
            on_disk.print_set_aside(record)
            continue
        try:
            _send(record, _spooled(record))
        except Exception as err:
            kind = failures.classify(err)
            if kind == failures.REFUSED:
                raise failures.refusal(err) from None
            if kind == failures.AWAY:   # kept, with what it already did, and everything after it
                record["reason"] = failures.reason(err)
                if not quiet:
                    print(f"warning: MLflow: the waiting {record['stage']} record could not be sent yet "
                          f"({record['reason']})", file=sys.stderr, flush=True)
                return
            on_disk.set_aside(doc, records.pop(0), failures.reason(err))
            on_disk.print_set_aside(record)
            continue
        records.pop(0)
        print(f"MLflow: sent the {record['stage']} record that waited in {shown(on_disk.queue_file())}"
              + (f" (registered {record['registers']!r} version {record['progress']['version']})"
                 if record["progress"].get("version") else ""), flush=True)


def replay(quiet: bool = False) -> int:
    """Send what waits, in order: the runs' unsent metrics and tags, then the stage records; stops at
    the first record whose server is away (those after it may need it: a tune record finds its run
    through the average record's link). Returns how many things still wait (set-aside ones aside);
    raises ``CredentialsRefused`` on a 401/403, keeping everything."""
    from pipeline.tracking.unsent.buffer import replay_unsent

    if not on_disk.queue_file().is_file():   # nothing waits: no lock taken, so no lock file left behind
        return 0
    with on_disk.locked():
        runs_left = replay_unsent(quiet=quiet)
        doc = on_disk.load()
        if runs_left or not doc["records"]:
            return runs_left + len(doc["records"])
        try:
            _replay_records(doc, quiet)
        finally:
            on_disk.save(doc)
        return len(doc["records"])


def _family(doc: Mapping[str, Any], entry_id: str) -> list[dict[str, Any]]:
    """The set-aside entry ``entry_id`` and those set aside because they need it (transitively), in order."""
    ids = {entry_id}
    for entry in doc["set_aside"]:   # held ones come after what holds them
        if entry.get("held_by") in ids:
            ids.add(entry["id"])
    return [entry for entry in doc["set_aside"] if entry["id"] in ids]


def retry(entry_id: str) -> list[dict[str, Any]]:
    """Put the set-aside entry and those it held back at the head of the queue (a run's leftovers
    back among the runs) and replay; returns them (empty: no such entry)."""
    with on_disk.locked():
        doc = on_disk.load()
        family = _family(doc, entry_id)
        if not family:
            return []
        doc["set_aside"] = [e for e in doc["set_aside"] if e not in family]
        records = []
        for entry in family:
            for key in ("reason", "held_by", "set_aside_at"):
                entry.pop(key, None)
            if entry["stage"] == "run":
                doc["runs"][entry["run_id"]] = entry["entry"]
            else:
                records.append(entry)
        doc["records"] = records + doc["records"]
        on_disk.save(doc)
        replay()
        return family


def drop(entry_id: str) -> list[dict[str, Any]]:
    """Remove the set-aside entry and those it held back, with their kept files; returns them."""
    with on_disk.locked():
        doc = on_disk.load()
        family = _family(doc, entry_id)
        doc["set_aside"] = [e for e in doc["set_aside"] if e not in family]
        on_disk.save(doc)
        return family


def listing(doc: Mapping[str, Any] | None = None) -> list[str]:
    """One line per waiting run, waiting record and set-aside entry (its ID first: what ``--retry``
    and ``--drop`` take), for ``replay --list``."""
    doc = doc if doc is not None else on_disk.load()
    lines = []
    for run_id, entry in doc["runs"].items():
        lines.append(f"waiting: leftovers of run {run_id}: {len(entry['metrics'])} metric values, "
                     f"{len(entry['tags'])} tags" + (f", its end ({entry['status']})" if entry.get("status") else ""))
    for record in doc["records"]:
        lines.append(f"waiting: {on_disk.entry_name(record)}{_registers(record)}"
                     + (f" ({record['reason']})" if record.get("reason") else ""))
    for entry in doc["set_aside"]:
        lines.append(f"{entry['id']}  set aside {entry.get('set_aside_at', '')}: {on_disk.entry_name(entry)}"
                     f"{_registers(entry)}: {entry['reason']}")
    return lines


def _registers(record: Mapping[str, Any]) -> str:
    if record.get("registers") and not (record.get("progress") or {}).get("version"):
        return f" (registers {record['registers']!r} for the model of sha256 {str(record.get('model_sha256'))[:12]})"
    return ""


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
    """One line on stderr saying what waits for the tracking server, and what is set aside, when anything is."""
    doc = doc if doc is not None else on_disk.load()
    aside = doc.get("set_aside") or []
    held = (f"set aside, not sent until handled: {', '.join(on_disk.entry_name(e) for e in aside)} ({HANDLED_BY})"
            if aside else "")
    if on_disk.waiting(doc):   # type: ignore[arg-type]
        print(f"warning: MLflow: waiting in {shown(on_disk.queue_file())} for {safe_uri(tracking_uri())}: "
              f"{describe(doc)}; sent by {SENT_BY}" + (f"; {held}" if held else ""), file=sys.stderr, flush=True)
    elif held:
        print(f"warning: MLflow: in {shown(on_disk.queue_file())}, {held}", file=sys.stderr, flush=True)


def pending_registration(model_sha256: str, root: Path = Path(".")) -> dict[str, Any] | None:
    """The waiting (or set-aside) record that is to register the model of ``model_sha256`` in the
    queue of ``root``'s repository, if any (the promotion gate's "no challenger yet")."""
    import json

    file = on_disk.repository_root(root) / on_disk.UNSENT_FILE
    try:
        doc = json.loads(file.read_text())
        records = [*(doc.get("records") or []), *(doc.get("set_aside") or [])]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return next((r for r in records if r.get("registers") and r.get("model_sha256") == model_sha256
                 and not (r.get("progress") or {}).get("version")), None)
