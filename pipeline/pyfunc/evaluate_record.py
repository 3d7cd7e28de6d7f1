"""The evaluate stage's record: scores, the decoding settings (tags), attention maps, translations,
the run's files and the registered pyfunc model (its model card included), in the run the tune stage
logged into (the model's, or its child), else the model's own run; a child when ``evaluate``
params changed. The model sent is the file the record names by sha256, never a later one."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag

from pipeline.tracking.links import LINK_MODEL, LINK_TUNED, lookup_run
from pipeline.tracking.runs import not_tracked, own_run
from pipeline.tracking.store import client

STAGE = "evaluate"   # the stage whose record this module sends (``deferred.SENDERS``)

# The record's files by name: folders logged as they are, files under "run/", the model and tokenizer.
FOLDERS = ("attention", "translations")
RUN_FILES = ("params.yaml", "dvc.lock", "metrics.json", "scores.json")   # scores.json: reports/evaluate/'s detail
MODEL, TOKENIZER, CORPUS_STATS = "model.pt", "spm.model", "stats.json"
CT2_MODEL = "ctranslate2"   # the export stage's folder, logged as the version's artifact of that name


def links(data: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(what the record needs found on the server, what it links there): the model's run, found
    through the average and tune records' links; nothing later needs this record."""
    return {data["model_sha256"]}, set()


def send(data: Mapping[str, Any], files: Mapping[str, Path], progress: MutableMapping[str, Any]) -> None:
    """``data``: experiment, section (``evaluate.*`` params), model_sha256, tuned (tune decoded this
    model), decoding (``ChosenDecoding.as_dict()``), values (the metrics to log), registered_model,
    timestamp (ms); registered_model "" logs the model without registering it (a sweep's point).
    ``files``: FOLDERS, RUN_FILES, MODEL, TOKENIZER, CORPUS_STATS and CT2_MODEL by name."""
    from pipeline.pyfunc.log_version import log_translator

    c = client()
    experiment, sha = data["experiment"], data["model_sha256"]
    if "run_id" not in progress:
        found = lookup_run(LINK_TUNED, sha, experiment, c) if data.get("tuned") else None
        found = found or lookup_run(LINK_MODEL, sha, experiment, c)
        if found is None:
            not_tracked(experiment, "evaluate")
        progress["run_id"] = found and own_run(c, found, data["section"], "evaluate")
    run_id = progress["run_id"]
    if not run_id:
        return
    c.log_batch(run_id, tags=[RunTag(f"decoding.{k}", str(v)) for k, v in data["decoding"].items()])
    now = int(data["timestamp"])
    c.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in data["values"].items()])
    for name in FOLDERS:
        if name in files and Path(files[name]).is_dir():
            c.log_artifacts(run_id, str(files[name]), name)
    for name in RUN_FILES:
        if name in files and Path(files[name]).is_file():
            c.log_artifact(run_id, str(files[name]), "run")
    if "version" not in progress:   # "" once a sweep's point logged its model (registered by none)
        version = log_translator(run_id, Path(files[MODEL]), Path(files[TOKENIZER]), data["registered_model"],
                                 data["decoding"], metrics_file=files.get("scores.json"),
                                 corpus_stats_file=files.get(CORPUS_STATS),
                                 ct2_model=Path(files[CT2_MODEL]) if CT2_MODEL in files else None)
        if not version and data["registered_model"]:
            raise RuntimeError(f"the model logged into run {run_id} was not registered as {data['registered_model']!r}")
        progress["version"] = version
    c.set_terminated(run_id, "FINISHED")
