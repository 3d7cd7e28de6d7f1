"""Stages find their MLflow run by content, never by an id written into their outputs (DVC hashes
those, and a run id differs on every machine): a run is tagged with the sha256 of the files it
made (``link.*`` tags: each checkpoint of the training, the averaged model, the model the tune stage
chose decoding settings for), and a later stage, or a resumed training, looks up the newest run
tagged with the sha256 of the file it reads (``find_run``)."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from mlflow.tracking import MlflowClient

from pipeline.tracking.store import client
from pipeline.tracking.sweep_point import point_experiment
from pipeline.tracking.unsent import deferred

# Tags linking a run to the files it made (values: the file's sha256); see find_run.
LINK_CHECKPOINT = "link.checkpoint_sha256"   # every checkpoint the training wrote (the newest last)
LINK_MODEL = "link.model_sha256"             # models/model.pt, on the run the average stage logged into
LINK_TUNED = "link.tuned_model_sha256"       # models/model.pt, on the run the tune stage logged into
LINK_TRAINING = "link.training_sha256"       # the trainer's fingerprint (model, settings, data): what a
                                             # resumed training falls back to when its checkpoint's tag was lost


def fingerprint_sha256(fingerprint: Mapping[str, Any]) -> str:
    """sha256 of a trainer's fingerprint (``Trainer.fingerprint``), the same on every machine."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()


def point_scope() -> str:
    """A sweep's point looks among its own runs only (an MLflow filter clause; "" outside a pool sweep):
    two points that train alike write byte-identical checkpoints, and the other point's run must not
    be taken for this one's."""
    name = point_experiment()
    return f"tags.`sweep.experiment` = '{name}'" if name else ""


def lookup_run(tag: str, sha256s: str | Iterable[str], experiment: str, c: MlflowClient | None = None,
               where: str = "") -> str | None:
    """The newest run of ``experiment`` tagged ``tag`` = one of ``sha256s`` (tried in order), within
    the sweep point's runs in a pool sweep (``point_scope``); None when no run is tagged so. Raises
    what the store raises (a record waiting for the server needs to tell "no such run" from "no
    answer")."""
    values = [sha256s] if isinstance(sha256s, str) else list(sha256s)
    where = " and ".join(clause for clause in (where, point_scope()) if clause)
    c = c or client()
    found = c.get_experiment_by_name(experiment)
    if found is None:
        return None
    for value in values:
        runs = c.search_runs([found.experiment_id],
                             filter_string=f"tags.`{tag}` = '{value}'" + (f" and {where}" if where else ""),
                             order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            return runs[0].info.run_id
    return None


def find_run(tag: str, sha256s: str | Iterable[str], experiment: str, c: MlflowClient | None = None,
             where: str = "") -> str | None:
    """The newest run of ``experiment`` tagged ``tag`` = one of ``sha256s`` (tried in order): the
    run that made a file, found by the file's content. None when no run is tagged so (the file was
    made without tracking, or in another store) or the store cannot be reached (a warning).
    ``c``: the store to search (default: ``client()``'s); ``where``: a further MLflow filter clause.
    What waits in the unsent queue (an earlier stage's link tags and records) is replayed first."""
    try:
        c = c or client()
        deferred.replay(quiet=True)
        return lookup_run(tag, sha256s, experiment, c, where)
    except Exception as err:
        print(f"warning: MLflow run lookup failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr,
              flush=True)
    return None
