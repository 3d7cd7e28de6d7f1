"""The later stages' records: the average, tune and evaluate stages log into the training's run,
or, when their params differ from those the run already holds (``dvc exp run -S
evaluate.beam_size=1``), into a child run carrying all the parent's params with its own on top, so
every set of params has its own row in ``make compare``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from mlflow.entities import Param
from mlflow.tracking import MlflowClient

from pipeline.tracking.failures import best_effort
from pipeline.tracking.store import client, safe_uri, tracking_uri
from pipeline.tracking.tags import param_value, params_hash
from pipeline.tracking.unsent.buffer import save_unsent


def log_params(c: MlflowClient, run_id: str, params: Mapping[str, Any]) -> list[str]:
    """Log params not yet on the run; returns the keys whose logged value differs (not re-logged)."""
    existing = c.get_run(run_id).data.params
    new, conflicts = [], []
    for key, value in params.items():
        text = param_value(value)[:6000]
        if key not in existing:
            new.append(Param(key, text))
        elif existing[key] != text:
            conflicts.append(key)
    for i in range(0, len(new), 100):
        c.log_batch(run_id, params=new[i:i + 100])
    return conflicts


def not_tracked(experiment: str, stage: str) -> None:
    """The line a stage prints when no run made its input (made without tracking, or in another store)."""
    print(f"MLflow: no run of experiment {experiment!r} in {safe_uri(tracking_uri())} is tagged as the maker of "
          f"this stage's input; {stage} is not tracked", file=sys.stderr)


def own_run(c: MlflowClient, run_id: str, section_params: Mapping[str, Any], stage: str) -> str:
    """The run a later stage logs into, given the run that made its input: that run, or a new child
    run when this stage's params differ from those it already holds. Raises what the store raises."""
    parent = c.get_run(run_id)
    conflicts = log_params(c, run_id, section_params)
    if not conflicts:
        return run_id
    # Links stay with the run that made the file; the child is linked to what its stage makes.
    tags = {k: v for k, v in parent.data.tags.items() if not k.startswith(("mlflow.", "link.", "lineage."))}
    child = c.create_run(parent.info.experiment_id, tags={**tags, "mlflow.parentRunId": run_id,
                                                          "changed_params": ",".join(conflicts)},
                         run_name=f"{parent.info.run_name}-{stage}-{params_hash(section_params)}")
    log_params(c, child.info.run_id, {**parent.data.params, **section_params})
    print(f"MLflow: {stage} params differ from run {run_id} ({', '.join(conflicts)}); logging into child run "
          f"{child.info.run_id}", flush=True)
    return child.info.run_id


def finish_run(run_id: str | None, status: str = "FINISHED") -> None:
    """End the run; with the server away, the end is kept and replayed (``buffer.replay_unsent``)."""
    if run_id and best_effort("run end", _set_terminated, run_id, status) is None:
        save_unsent(run_id, [], status=status)


def _set_terminated(run_id: str, status: str) -> bool:
    client().set_terminated(run_id, status)
    return True
