"""The later stages' records: the average, tune and evaluate stages log into the training's run,
or, when their params differ from those the run already holds (``dvc exp run -S
evaluate.beam_size=1``), into a child run carrying all the parent's params with its own on top, so
every set of params has its own row in ``make compare``."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from pipeline.tracking.buffer import save_unsent
from pipeline.tracking.store import best_effort, client, tracking_uri
from pipeline.tracking.tags import param_value, params_hash


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


def stage_run(run_id: str | None, experiment: str, section_params: Mapping[str, Any], stage: str) -> str | None:
    """The run a later stage (average, evaluate) logs into: the training run, or a child run
    when this stage's params differ from those the training run already holds."""
    if not run_id:
        print(f"MLflow: no run of experiment {experiment!r} in {tracking_uri()} is tagged as the maker of this "
              f"stage's input; {stage} is not tracked", file=sys.stderr)
        return None
    c = client()
    try:
        parent = c.get_run(run_id)
    except Exception as err:
        print(f"warning: MLflow run {run_id} not reachable ({type(err).__name__}); {stage} is not tracked",
              file=sys.stderr)
        return None
    conflicts = log_params(c, run_id, section_params)
    if not conflicts:
        return run_id
    # Links stay with the run that made the file; the child is linked to what its stage makes.
    tags = {k: v for k, v in parent.data.tags.items() if not k.startswith(("mlflow.", "link."))}
    child = c.create_run(parent.info.experiment_id, tags={**tags, "mlflow.parentRunId": run_id,
                                                          "changed_params": ",".join(conflicts)},
                         run_name=f"{parent.info.run_name}-{stage}-{params_hash(section_params)}")
    log_params(c, child.info.run_id, {**parent.data.params, **section_params})
    print(f"MLflow: {stage} params differ from run {run_id} ({', '.join(conflicts)}); logging into child run "
          f"{child.info.run_id}", flush=True)
    return child.info.run_id


def log_metrics(run_id: str | None, metrics: Mapping[str, float], step: int = 0) -> None:
    if run_id:
        now = int(time.time() * 1000)
        best_effort("metrics", client().log_batch, run_id,
              metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def log_artifacts(run_id: str | None, files: Iterable[Path], artifact_path: str | None = None) -> None:
    if not run_id:
        return
    c = client()
    for f in files:
        if Path(f).is_dir():
            best_effort("artifacts", c.log_artifacts, run_id, str(f), artifact_path)
        elif Path(f).is_file():
            best_effort("artifact", c.log_artifact, run_id, str(f), artifact_path)


def finish_run(run_id: str | None, status: str = "FINISHED") -> None:
    """End the run; with the server away, the end is kept and replayed (``buffer.replay_unsent``)."""
    if run_id and best_effort("run end", _set_terminated, run_id, status) is None:
        save_unsent(run_id, [], status=status)


def _set_terminated(run_id: str, status: str) -> bool:
    client().set_terminated(run_id, status)
    return True


def log_tune(run_id: str | None, report: Mapping[str, Any], report_files: list[Path], seconds: float,
             point_seconds: Iterable[float] = ()) -> None:
    """The tune stage's record in ``run_id``: ``valid_bleu`` (validation BLEU of the chosen beam size
    and alpha: what sweeps rank runs by), the chosen point's chrF and length ratio, the whole grid as
    a table artifact (``tune/grid.json``, read back by ``MlflowClient.load_table``; with each point's
    decoding time, which the report files leave out) and ``report_files``. ``report``: the detail,
    ``reports/tune/scores.json``."""
    if not run_id:
        return
    chosen = report["chosen"]
    log_metrics(run_id, {"valid_bleu": chosen["bleu"], "tune/valid_chrf": chosen["chrf"],
                         "tune/valid_length_ratio": chosen["length_ratio"], "time/tune_seconds": seconds})
    grid = [dict(point) for point in report["grid"]]
    for point, point_time in zip(grid, point_seconds):
        point["seconds"] = point_time
    if grid:
        table = {key: [point[key] for point in grid] for key in grid[0]}
        best_effort("table", client().log_table, run_id, table, "tune/grid.json")
    log_artifacts(run_id, report_files, "tune")
