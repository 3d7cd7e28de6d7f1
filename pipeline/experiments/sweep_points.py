"""A sweep on a work pool (``pipeline.workers.sweep``): its name, its points' experiment names, their
flow runs on the Prefect server, and what a rerun of the sweep does with each point.

A rerun never runs a point twice: a point whose experiment is on the repository is finished; one
whose flow run is still scheduled or running is followed, not submitted again; one whose flow run
crashed (its worker killed mid-training) goes back to that worker's own queue, where its checkpoints
are, and resumes; a failed one, or one never run, is submitted to the pool's default queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# What a point pulls from the remote and never makes again (the stages before training).
DATA_STAGES = ("download", "references", "tokenizer")
QUEUE_TAG = "worker-queue:"      # a point's flow run is tagged with its worker's own queue
SWEEP_TAG = "sweep:"             # every flow run of a sweep
POINT_TAG = "point:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,80}$")


class SweepNameError(ValueError):
    pass


def check_sweep_name(name: str) -> str:
    """A sweep's name names its deployment, tags and DVC experiments (git refs): letters, digits,
    ``.``, ``_``, ``-``; not ending in ``.lock`` or ``.``, no ``..``."""
    if not _NAME.match(name) or ".." in name or name.endswith((".lock", ".")):
        raise SweepNameError(f"sweep name {name!r}: letters, digits, '.', '_' and '-' only (at most 81, starting "
                             "with a letter or digit)")
    return name


def experiment_name(sweep: str, point: int) -> str:
    """The DVC experiment of point ``point`` (0-based, the grid's order) of ``sweep``."""
    return f"{sweep}-p{point}"


@dataclass(frozen=True)
class PointRun:
    """The newest flow run of a point, as a plan needs it."""
    flow_run_id: str
    state: str            # Prefect's state type: SCHEDULED, PENDING, RUNNING, COMPLETED, FAILED, CRASHED, ...
    final: bool
    tags: tuple[str, ...]
    message: str = ""
    values: dict[str, Any] | None = None   # the point's grid values, as the run was given them

    @property
    def worker_queue(self) -> str:
        return next((t[len(QUEUE_TAG):] for t in self.tags if t.startswith(QUEUE_TAG)), "")


@dataclass(frozen=True)
class Step:
    point: int
    action: str           # "finished" | "follow" | "resume" | "submit"
    queue: str = ""       # resume: the crashed run's worker queue
    flow_run_id: str = ""  # the point's newest flow run: followed, or replaced by a new one
    why: str = ""


def plan(points: list[dict[str, Any]], sweep: str, pushed: set[str], runs: dict[int, PointRun],
         online: set[str] | None = None) -> list[Step]:
    """What to do with each point, given the experiments pushed to the repository, each point's
    newest flow run and the queues of the workers online (``None``: not known, every one counts);
    a crashed point whose worker is offline starts afresh on any worker."""
    steps = []
    for point in range(len(points)):
        run = runs.get(point)
        if experiment_name(sweep, point) in pushed:
            steps.append(Step(point, "finished", why="its experiment is on the repository"))
        elif run is not None and not run.final:
            steps.append(Step(point, "follow", flow_run_id=run.flow_run_id, why=f"its flow run is {run.state}"))
        elif run is not None and run.state == "CRASHED" and run.worker_queue \
                and (online is None or run.worker_queue in online):
            steps.append(Step(point, "resume", queue=run.worker_queue, flow_run_id=run.flow_run_id,
                              why=f"it crashed on {run.worker_queue}, where its checkpoints are"))
        elif run is not None and run.state == "CRASHED" and run.worker_queue:
            steps.append(Step(point, "submit", flow_run_id=run.flow_run_id,
                              why=f"it crashed on {run.worker_queue}, whose worker is offline: starting afresh "
                                  "on any worker"))
        else:
            why = f"its last flow run ended {run.state}" + (f": {run.message}" if run.message else "") if run else ""
            steps.append(Step(point, "submit", flow_run_id=run.flow_run_id if run else "", why=why or "not run yet"))
    return steps


def point_runs(sweep: str) -> dict[int, PointRun]:
    """The newest flow run of each point of ``sweep`` on the Prefect server (``PREFECT_API_URL``),
    found by the sweep's tag."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    newest: dict[int, PointRun] = {}
    runs: list[Any] = []
    with get_client(sync_client=True) as client:
        tagged = FlowRunFilter(tags=FlowRunFilterTags(all_=[f"{SWEEP_TAG}{sweep}"]))
        while True:   # the API answers at most 200 at a time
            page = client.read_flow_runs(flow_run_filter=tagged, sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                                         limit=200, offset=len(runs))
            runs += page
            if len(page) < 200:
                break
    for run in sorted(runs, key=lambda r: r.created, reverse=True):
        parameters = run.parameters or {}
        point = parameters.get("point")
        if isinstance(point, int) and point not in newest and run.state is not None:
            values = parameters.get("values")
            newest[point] = PointRun(str(run.id), run.state.type.value, run.state.is_final(), tuple(run.tags),
                                     run.state.message or "", values if isinstance(values, dict) else None)
    return newest


def tagged_runs(experiment: str, sweep: str):
    """Every MLflow run of ``experiment`` tagged with ``sweep`` (``mlflow.search_runs``' DataFrame)."""
    import mlflow

    from pipeline.tracking import store

    store.client()
    quoted = sweep.replace("'", "\\'")
    return mlflow.search_runs(experiment_names=[experiment], filter_string=f"tags.sweep = '{quoted}'",
                              max_results=10_000)


def ranked_runs(experiment: str, sweep: str):
    """The MLflow runs of ``sweep`` (tag ``sweep``) in ``experiment``, best validation BLEU first
    (``RANK_METRIC``; runs without it last): a pandas DataFrame of ``mlflow.search_runs``."""
    from pipeline.scoring.reports import RANK_METRIC

    runs = tagged_runs(experiment, sweep)
    column = f"metrics.{RANK_METRIC}"
    if runs.empty:
        return runs
    if column not in runs.columns:
        runs[column] = float("nan")
    return runs.sort_values(column, ascending=False, na_position="last", kind="stable").reset_index(drop=True)


def top_points(experiment: str, sweep: str, k: int) -> list[dict[str, Any]]:
    """The grid values (tag ``sweep.overrides``) of the ``k`` best points of ``sweep`` by validation
    BLEU, best first; points without a score are never chosen."""
    import json
    import math

    from pipeline.scoring.reports import RANK_METRIC

    runs = ranked_runs(experiment, sweep)
    chosen: list[dict[str, Any]] = []
    for _, run in runs.iterrows():
        score, values = run.get(f"metrics.{RANK_METRIC}"), run.get("tags.sweep.overrides")
        if score is None or math.isnan(score) or not isinstance(values, str):
            continue
        parsed = json.loads(values)
        if parsed not in chosen:
            chosen.append(parsed)
        if len(chosen) == k:
            break
    return chosen
