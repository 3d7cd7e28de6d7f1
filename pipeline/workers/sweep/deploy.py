"""The sweep's deployment, ``team-sweep-point/<sweep>``: the point flow pinned to the sweep's commit in
the team's pool, no schedule, and no concurrency limit of its own (a worker started with ``--limit 1``
runs one point at a time, so as many points run at once as the pool has workers); its runs carry
heartbeats, and the crash detection of ``pipeline.workers.deploy`` marks a run whose worker died
``Crashed``. A rerun of the sweep finds the deployment and keeps its commit.
"""

from __future__ import annotations

from pipeline.experiments.sweep_points import SWEEP_TAG
from pipeline.workers.deploy import HEARTBEAT_GRACE_S, HEARTBEAT_S, Deployed, crash_detection, ensure_pool
from pipeline.workers.sweep.flow import FLOW_NAME, sweep_point
from pipeline.workers.workspace import pull_steps

ENTRYPOINT = "pipeline/workers/sweep/flow.py:sweep_point"


class PinnedElsewhere(ValueError):
    """The sweep's deployment exists, pinned to another commit."""


def pinned_commit(client, name: str) -> str:  # noqa: ANN001 (SyncPrefectClient)
    """The commit the sweep's deployment is pinned to ("" when there is no such deployment)."""
    from prefect.exceptions import ObjectNotFound

    try:
        deployment = client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
    except ObjectNotFound:
        return ""
    for step in deployment.pull_steps or []:
        for spec in step.values():
            commit = (spec.get("env") or {}).get("TEAM_COMMIT") if isinstance(spec, dict) else None
            if commit:
                return commit
    return ""


def deploy_sweep(repository: str, commit: str, pool: str, sweep: str,
                 crash_grace_s: int = HEARTBEAT_GRACE_S) -> Deployed:
    """Create the sweep's deployment (or find it, when pinned to ``commit``: a rerun)."""
    from prefect import get_client
    from prefect.utilities.callables import parameter_schema

    steps = pull_steps(repository, commit)
    with get_client(sync_client=True) as client:
        pinned = pinned_commit(client, sweep)
        if pinned and pinned != commit:
            raise PinnedElsewhere(f"sweep {sweep!r} is pinned to commit {pinned[:12]}, not {commit[:12]}: rerun it "
                                  f"from that commit, or name a new sweep")
        ensure_pool(client, pool)
        flow_id = client.create_flow_from_name(FLOW_NAME)
        deployment_id = client.create_deployment(
            flow_id, sweep, version=commit[:12], work_pool_name=pool, entrypoint=ENTRYPOINT, pull_steps=steps,
            parameter_openapi_schema=parameter_schema(sweep_point).model_dump_for_openapi(),
            tags=["sweep", f"{SWEEP_TAG}{sweep}"],
            job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}},
            description=f"sweep {sweep}: its points at {commit} of {repository}")
        crash_detection(client, deployment_id, f"{FLOW_NAME}/{sweep}", crash_grace_s)
    return Deployed(deployment_id, f"{FLOW_NAME}/{sweep}", pool, commit)
