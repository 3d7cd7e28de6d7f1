"""Submit a sweep's points to its deployment and follow them to the end.

``finished_experiments`` asks DVC which of the sweep's experiments are on the repository
(``dvc exp list <repository> --rev <commit>``); ``sweep_points.plan`` says what each point needs;
``online_queues`` which workers can take a resumed point back; ``submit`` makes one flow run per
point to submit or resume (a resumed one on its worker's own queue, one run per point even when two
commands plan at once: an idempotency key);
``follow`` prints each point's state as it changes until every one is final.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

from pipeline.config.overrides import dvc_executable, hydra_value
from pipeline.experiments.sweep_points import POINT_TAG, SWEEP_TAG, Step, experiment_name
from pipeline.workers.queues import own_queue

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
        detail = (proc.stderr or proc.stdout).strip()[-400:].replace(repository, redacted(repository))
        raise FanoutError(f"dvc exp list {redacted(repository)} failed: {detail}")
    return {line.strip() for line in proc.stdout.splitlines() if line.strip().startswith(f"{sweep}-p")}


def online_queues(pool: str) -> set[str]:
    """The own queues of the pool's workers that are online (their heartbeats are on time)."""
    from prefect import get_client
    from prefect.client.schemas.objects import WorkerStatus

    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    return {own_queue(w.name) for w in workers if w.status == WorkerStatus.ONLINE}


def redacted(url: str) -> str:
    """``url`` without the password or token a git URL may carry (``https://user:token@host/...``)."""
    parts = urlsplit(url)
    if parts.password is None and not (parts.username and parts.scheme in ("http", "https")):
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=f"***@{host}" + (f":{parts.port}" if parts.port else "")))


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
            # Two sweep commands planning at once make one flow run per point, not two.
            key = f"{sweep}:{step.point}:after:{step.flow_run_id or 'none'}"
            run = client.create_flow_run_from_deployment(
                deployment_id, parameters={"sweep": sweep, "point": step.point, "overrides": point.overrides,
                                           "values": point.values},
                name=experiment_name(sweep, step.point), tags=[f"{SWEEP_TAG}{sweep}", f"{POINT_TAG}{step.point}"],
                work_queue_name=step.queue or None, idempotency_key=key)
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
            pending = [run_id for run_id, point in by_id.items() if point not in final]
            runs = [run for i in range(0, len(pending), 200) for run in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=pending[i:i + 200])), limit=200)]
            for gone in set(pending) - {run.id for run in runs}:   # deleted on the server
                final[by_id[gone]] = ("DELETED", "its flow run was deleted")
                out(f"  point {by_id[gone]} ({points[by_id[gone]].label()}): DELETED")
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

