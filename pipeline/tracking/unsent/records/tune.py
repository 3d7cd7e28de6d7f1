"""The tune stage's record: the model's run (a child when ``tune`` params changed), tagged as the run
evaluate logs into, with ``valid_bleu`` (the chosen point's validation BLEU: what sweeps rank by),
its chrF, length ratio and, for Multi30k, the literature's BLEU (``tune/valid_bleu_lc_tok``, never
ranking), each engine's own chosen point's BLEU (``tune/valid_bleu/<engine>``), the whole grid as a
table artifact (``tune/grid.json``, with each point's decoding time, which the report file leaves
out) and the report file."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric

from pipeline.scoring.reports import LITERATURE_KEY
from pipeline.tracking.links import LINK_MODEL, LINK_TUNED, lookup_run
from pipeline.tracking.runs import not_tracked, own_run
from pipeline.tracking.store import client

STAGE = "tune"   # the stage whose record this module sends (``deferred.SENDERS``)

REPORT, DETAIL = "tune.json", "scores.json"   # the reports' names among the record's files (docs/metrics.md)


def links(data: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """(what the record needs found on the server, what it links there): the model, by the average
    record's link; the run evaluate logs into (``LINK_TUNED``, the same sha256)."""
    return {data["model_sha256"]}, {data["model_sha256"]}


def send(data: Mapping[str, Any], files: Mapping[str, Path], progress: MutableMapping[str, Any]) -> None:
    """``data``: experiment, section (``tune.*`` params and the chosen point), model_sha256, report,
    seconds, times (per grid point), timestamp (ms). ``files``: the report (``tune.json``)."""
    c = client()
    if "run_id" not in progress:
        model_run = lookup_run(LINK_MODEL, data["model_sha256"], data["experiment"], c)
        if model_run is None:
            not_tracked(data["experiment"], "tune")
        progress["model_run"] = model_run
        progress["run_id"] = model_run and own_run(c, model_run, data["section"], "tune")
    run_id = progress["run_id"]
    if not run_id:
        return
    c.set_tag(run_id, LINK_TUNED, data["model_sha256"])   # evaluate logs into the same run
    chosen, now = data["report"]["chosen"], int(data["timestamp"])
    values = {"valid_bleu": chosen["bleu"], "tune/valid_chrf": chosen["chrf"],
              "tune/valid_length_ratio": chosen["length_ratio"], "time/tune_seconds": data["seconds"]}
    if LITERATURE_KEY in chosen:   # the literature's BLEU (Multi30k), reported: valid_bleu ranks
        values[f"tune/valid_{LITERATURE_KEY}"] = chosen[LITERATURE_KEY]
    for engine, searched in (data["report"].get("engines") or {}).items():   # each engine's own choice
        values[f"tune/valid_bleu/{engine}"] = searched["chosen"]["bleu"]
    c.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()])
    grid = [dict(point) for point in data["report"]["grid"]]
    for point, seconds in zip(grid, data.get("times") or []):
        point["seconds"] = seconds
    if grid:
        c.log_table(run_id, {key: [point[key] for point in grid] for key in grid[0]}, "tune/grid.json")
    for name in (REPORT, DETAIL):
        if name in files and Path(files[name]).is_file():
            c.log_artifact(run_id, str(files[name]), "tune")
    if run_id != progress["model_run"]:
        c.set_terminated(run_id)   # a child run of its own (tune params changed); evaluate logs into it too
