"""Submit a sweep's points to its deployment and follow them to the end.

``finished_experiments`` asks DVC which of the sweep's experiments are on the repository
(``dvc exp list <repository> --rev <commit>``); ``sweep_points.plan`` says what each point needs;
``submit`` makes one flow run per point to submit or resume (a resumed one on its worker's own queue);
``follow`` prints each point's state as it changes until every one is final.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pipeline.config.overrides import dvc_executable, hydra_value
from pipeline.experiments.sweep_points import POINT_TAG, SWEEP_TAG, Step, experiment_name

POLL_S = 3.0


class FanoutError(RuntimeError):
    pass


@dataclass(frozen=True)
class Point:
    overrides: dict[str, Any]    # every -S the point sets: its grid values and the phase's fixed ones
    values: dict[str, Any]       # its grid values (what tells it from the other points)

    def label(self) -> str:
        return " ".join(f"{k}={hydra_value(v)}" for k, v in self.values.items())


def finished_experiments(repository: str, commit: str, sweep: str) -> set[str]:
    """The sweep's experiments that were pushed to ``repository`` (derived from ``commit``)."""
    proc = subprocess.run([dvc_executable(), "exp", "list", repository, "--rev", commit, "--name-only"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise FanoutError(f"dvc exp list {repository} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return {line.strip() for line in proc.stdout.splitlines() if line.strip().startswith(f"{sweep}-p")}


def submit(deployment_id: UUID, sweep: str, steps: list[Step], points: list[Point]) -> dict[int, str]:
    """One flow run per point to submit or resume; returns ``{point: flow run id}`` of those and of the
    points already in flight (followed, not submitted again)."""
    from prefect import get_client

    ids = {s.point: s.flow_run_id for s in steps if s.action == "follow"}
    with get_client(sync_client=True) as client:
        for step in steps:
            if step.action not in ("submit", "resume"):
                continue
            point = points[step.point]
            run = client.create_flow_run_from_deployment(
                deployment_id, parameters={"sweep": sweep, "point": step.point, "overrides": point.overrides,
                                           "values": point.values},
                name=experiment_name(sweep, step.point), tags=[f"{SWEEP_TAG}{sweep}", f"{POINT_TAG}{step.point}"],
                work_queue_name=step.queue or None)
            ids[step.point] = str(run.id)
    return ids


def follow(ids: Mapping[int, str], points: list[Point], out: Callable[[str], None] = print,
           poll_s: float = POLL_S) -> dict[int, tuple[str, str]]:
    """Wait until every flow run in ``ids`` is final, printing each point's state when it changes;
    returns ``{point: (state type, message)}``."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    seen: dict[int, str] = {}
    final: dict[int, tuple[str, str]] = {}
    by_id = {UUID(run_id): point for point, run_id in ids.items()}
    with get_client(sync_client=True) as client:
        while len(final) < len(ids):
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(by_id))),
                                         limit=len(by_id))
            for run in runs:
                point = by_id[run.id]
                if run.state is None or point in final:
                    continue
                state = run.state.type.value
                if seen.get(point) != state:
                    seen[point] = state
                    message = f": {run.state.message}" if run.state.message and run.state.is_final() else ""
                    out(f"  point {point} ({points[point].label()}): {state}{message}")
                if run.state.is_final():
                    final[point] = (state, run.state.message or "")
            if len(final) < len(ids):
                time.sleep(poll_s)
    return final


def describe(steps: list[Step], points: list[Point]) -> list[str]:
    return [f"  point {s.point} ({points[s.point].label()}): {s.action}" + (f" on {s.queue}" if s.queue else "")
            + f" ({s.why})" for s in steps]

