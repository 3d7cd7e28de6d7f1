"""The average stage's record: the training run (found by the newest averaged checkpoint's sha256),
or its child when ``average`` params changed, linked to the averaged model's sha256 (where tune and
evaluate find it), with the averaging's metrics."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric

from pipeline.tracking.links import LINK_CHECKPOINT, LINK_MODEL, lookup_run
from pipeline.tracking.runs import not_tracked, own_run
from pipeline.tracking.store import client

STAGE = "average"   # the stage whose record this module sends (``deferred.SENDERS``)


def links(data: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(what the record needs found on the server, what it links there): the training's newest
    averaged checkpoint; the averaged model, found by tune and evaluate."""
    return {data["checkpoint_sha256"]}, {data["model_sha256"]}


def send(data: Mapping[str, Any], files: Mapping[str, Path], progress: MutableMapping[str, Any]) -> None:
    """``data``: experiment, section (the ``average.*`` params), checkpoint_sha256, model_sha256,
    metrics, timestamp (ms)."""
    c = client()
    if "run_id" not in progress:
        training = lookup_run(LINK_CHECKPOINT, data["checkpoint_sha256"], data["experiment"], c)
        if training is None:
            not_tracked(data["experiment"], "average")
        progress["run_id"] = training and own_run(c, training, data["section"], "average")
    run_id = progress["run_id"]
    if not run_id:
        return
    c.set_tag(run_id, LINK_MODEL, data["model_sha256"])
    c.log_batch(run_id, metrics=[Metric(k, float(v), int(data["timestamp"]), 0) for k, v in data["metrics"].items()])
