"""The training's record, for a training that started while the tracking server was away or refused
it (``callback.MlflowCallback`` had no run to log into): the run it would have made, waiting in the
unsent queue and sent once the server answers, before the later stages' records (which find the run
through its checkpoint link tag, as they would have found the live one).

Sent, it makes the same choices the callback makes at the start of a training: an unfinished run
that wrote the checkpoint it resumed from (or of the same trainer fingerprint) is continued (only
the curve points it lacks are sent); otherwise a new run is created, tagged
``lineage.continued_from_run`` with the finished run whose checkpoint (or, fine-tuning, whose
model) it started from. A record sent half-way keeps its run (``progress``): a replay never makes
a second one."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from pipeline.tracking.links import LINK_CHECKPOINT, LINK_MODEL, LINK_TRAINING, lookup_run
from pipeline.tracking.runs import log_params
from pipeline.tracking.store import client, experiment_id

STAGE = "train"   # the stage whose record this module sends (``deferred.SENDERS``)

UNFINISHED = "attributes.status != 'FINISHED'"   # running, failed or killed: a training may continue it
LINEAGE = "lineage.continued_from_run"   # on a new run: the finished run whose model it trains further
BATCH = 1000   # MLflow's log_batch limit


def _continued(c: MlflowClient, data: Mapping[str, Any]) -> str | None:
    """The unfinished run the training continues, if any (a resumed training only)."""
    shas, experiment = data["resumed_from"], data["experiment"]
    if not shas:
        return None
    found = lookup_run(LINK_CHECKPOINT, shas, experiment, c, where=UNFINISHED)
    if found is None and data["tags"].get(LINK_TRAINING):
        found = lookup_run(LINK_TRAINING, data["tags"][LINK_TRAINING], experiment, c, where=UNFINISHED)
    return found


def _parent(c: MlflowClient, data: Mapping[str, Any]) -> str | None:
    """The finished run whose checkpoint the training continues, else the run that made its
    ``train.init_from`` (fine-tuning); None for a training from scratch."""
    experiment = data["experiment"]
    if data["resumed_from"]:
        found = lookup_run(LINK_CHECKPOINT, data["resumed_from"], experiment, c)
        if found:
            return found
    sha = data.get("init_sha256")
    return sha and (lookup_run(LINK_MODEL, sha, experiment, c) or lookup_run(LINK_CHECKPOINT, sha, experiment, c))


def _open(c: MlflowClient, data: Mapping[str, Any]) -> tuple[str, bool]:
    """The run the record logs into, and whether it was created for it."""
    run_id = _continued(c, data)
    if run_id is not None:
        c.update_run(run_id, "RUNNING")
        return run_id, False
    tags = dict(data["tags"])
    parent = _parent(c, data)
    if parent:
        tags[LINEAGE] = parent
    run = c.create_run(experiment_id(data["experiment"], c), start_time=data["start_time"], tags=tags,
                       run_name=data["run_name"])
    return run.info.run_id, True


def _missing(c: MlflowClient, run_id: str, metrics: list[Metric]) -> list[Metric]:
    """The values of steps the run has not logged yet (a continued run holds its curve up to the
    checkpoint; the record holds it too, from the checkpoint's history)."""
    logged = {key: {m.step for m in c.get_metric_history(run_id, key)} for key in {m.key for m in metrics}}
    return [m for m in metrics if m.step not in logged[m.key]]


def links(data: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(what the record needs found on the server, what it links there): the checkpoints it resumed
    from and the weights it was initialised with (the run it continues, its lineage); its own
    checkpoints, by which the average record finds the run."""
    needs = set(data.get("resumed_from") or []) | ({data["init_sha256"]} if data.get("init_sha256") else set())
    return needs, set((data.get("link_tags") or {}).values())


def send(data: Mapping[str, Any], files: Mapping[str, Path], progress: MutableMapping[str, Any]) -> None:
    """``data``: experiment, run_name, start_time and end_time (ms), params (``derived.*`` among them),
    tags (set when the run is made), resumed_from (the sha256s of the checkpoints it resumed from,
    newest first), init_sha256, metrics ([key, value, step, timestamp] each), link_tags (the
    checkpoint links, set after the metrics), status (the run's end; None for a training stopped
    to be resumed)."""
    c = client()
    if "run_id" not in progress:
        progress["run_id"], progress["created"] = _open(c, data)
    run_id = progress["run_id"]
    if not progress.get("params_sent"):
        log_params(c, run_id, data["params"])
        c.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in data["tags"].items()], synchronous=True)
        progress["params_sent"] = True
    metrics = [Metric(key, float(value), int(timestamp), int(step)) for key, value, step, timestamp in data["metrics"]]
    if progress["created"]:
        start = progress.get("metrics_sent", 0)
    else:
        metrics, start = _missing(c, run_id, metrics), 0
    for i in range(start, len(metrics), BATCH):
        c.log_batch(run_id, metrics=metrics[i:i + BATCH], synchronous=True)
        if progress["created"]:
            progress["metrics_sent"] = i + BATCH
    if data["link_tags"]:
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in data["link_tags"].items()], synchronous=True)
    if data["status"]:
        c.set_terminated(run_id, data["status"], end_time=data["end_time"])
    made = "made" if progress["created"] else "continued"
    print(f"MLflow: {made} run {run_id} from the training's record ({len(data['metrics'])} metric values)",
          flush=True)
