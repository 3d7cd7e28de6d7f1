"""The Prefect client in a process of its own, for the worker tests (the test process keeps no
Prefect settings of another server): ``python prefect_runs.py start NAME`` starts a run of the
deployment and prints its id; ``wait ID TIMEOUT`` waits for a final state; ``state ID``,
``logs ID``, ``deployment NAME``, ``scheduled NAME`` and ``sweep-runs SWEEP`` print what they say,
as JSON. The API and its auth come from the environment (the stack's env file)."""

from __future__ import annotations

import json
import sys
import time
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    FlowRunFilterState,
    FlowRunFilterStateType,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment


def state(client, run_id: str) -> dict:
    run = client.read_flow_run(run_id)
    return {"id": str(run.id), "type": run.state.type.value, "name": run.state.name,
            "message": run.state.message or "", "final": run.state.is_final()}


def flow_logs(client, run_id: str) -> list:
    """The logs of the run and of its subflows (each subflow run keeps its own), oldest first."""
    ids, frontier = [UUID(run_id)], [UUID(run_id)]
    while frontier:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)))
        frontier = [child.id for child in children if child.id not in ids]
        ids += frontier
    logs, offset = [], 0
    while True:   # the API pages at 200
        page = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)), limit=200, offset=offset)
        logs += page
        offset += len(page)
        if len(page) < 200:
            return sorted(logs, key=lambda log: log.timestamp)


def main(command: str, *args: str) -> None:
    with get_client(sync_client=True) as client:
        if command == "start":
            print(json.dumps({"id": str(run_deployment(args[0], timeout=0).id)}))
        elif command == "state":
            print(json.dumps(state(client, args[0])))
        elif command == "wait":
            deadline = time.monotonic() + float(args[1])
            while not (current := state(client, args[0]))["final"] and time.monotonic() < deadline:
                time.sleep(1)
            print(json.dumps(current))
        elif command == "logs":
            print(json.dumps([log.message for log in flow_logs(client, args[0])]))
        elif command == "deployment":
            d = client.read_deployment_by_name(args[0])
            print(json.dumps({"version": d.version, "concurrency_limit": d.global_concurrency_limit.limit
                              if d.global_concurrency_limit else None, "entrypoint": d.entrypoint,
                              "pull_steps": d.pull_steps, "work_pool_name": d.work_pool_name,
                              "schedules": [s.schedule.cron for s in d.schedules], "parameters": d.parameters}))
        elif command == "scheduled":
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[args[0].split("/")[-1]])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
            print(json.dumps([r.expected_start_time.isoformat() for r in runs]))
        elif command == "sweep-runs":   # the newest flow run of each point of a sweep
            from pipeline.experiments.sweep_points import point_runs

            print(json.dumps({str(point): {"id": run.flow_run_id, "state": run.state, "tags": list(run.tags)}
                              for point, run in point_runs(args[0]).items()}))
        else:
            raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main(*sys.argv[1:])
