"""The ``team-retraining`` deployment on the team's Prefect server: a ``process`` work pool, the
flow's code pinned to one commit of the project's git repository (``pipeline.workers.workspace``),
params.yaml's cron schedule, and at most one flow run at a time (a second scheduled run waits
until the first ends: two runs in one workspace would train over each other's checkpoints).

Through Prefect's client API (``create_work_pool``, ``create_deployment``), which keeps the pull
steps exactly as given: the flow-run process resolves ``{{ $TEAM_WORKSPACE }}`` on the worker.
Deploying again with the same name updates the deployment (a new commit, a new schedule).

A worker that is stopped (SIGINT) or dies kills its flow-run processes without a word to the
server (Prefect 3.8's process worker: the run's process is SIGKILLed with the worker's task
group), so the run would show ``Running`` forever and hold the deployment's one concurrency slot.
Prefect's answer is heartbeats: every flow run of this deployment sends one every
``HEARTBEAT_S`` seconds (a job variable), and an automation (``crash_detection``) marks a run
``Crashed`` when none came for ``HEARTBEAT_S`` + a grace (``HEARTBEAT_GRACE_S`` unless the deploy
command sets ``--crash-grace``) seconds, which frees the slot.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from pipeline.config.flows import FlowsParams
from pipeline.workers.workspace import pull_steps

ENTRYPOINT = "pipeline/workers/flow.py:team_retraining"
HEARTBEAT_S = 30          # Prefect's minimum
HEARTBEAT_GRACE_S = 45
FLOW_NAME = "team-retraining"
POOL_TYPE = "process"


# What decides what the workers run, besides the stages' code: compared with the pinned commit.
PIPELINE_FILES = ("dvc.yaml", "dvc.lock", "params.yaml")


class WorkingTreeError(ValueError):
    """The working tree differs from the pinned commit in what the workers would run."""


def pipeline_paths(dvc_yaml: Path) -> list[str]:
    """dvc.yaml, dvc.lock, params.yaml, the params files stages read and every stage's deps (git
    pathspecs: DVC-tracked data in them is git-ignored, so only code and ``.dvc`` files count)."""
    import yaml

    paths = set(PIPELINE_FILES)
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {}) if dvc_yaml.is_file() else {}
    for stage in stages.values():
        paths.update(dep for dep in stage.get("deps", []) if isinstance(dep, str))
        paths.update(f for entry in stage.get("params", []) if isinstance(entry, dict) for f in entry)
    return sorted(paths)


def uncommitted_changes(commit: str, repo: Path = Path(".")) -> list[str]:
    """Files of ``pipeline_paths`` that differ in the working tree (staged or not) from ``commit``,
    or are new and untracked: what a worker, which checks out ``commit``, would not see."""
    paths = pipeline_paths(repo / "dvc.yaml")

    def git(*args: str) -> list[str]:
        proc = subprocess.run(["git", *args, "--", *paths], cwd=repo, capture_output=True, text=True)
        if proc.returncode != 0:
            raise WorkingTreeError(f"git {args[0]} failed: {proc.stderr.strip()}")
        return [line for line in proc.stdout.splitlines() if line]

    return sorted(set(git("diff", "--name-only", commit)) | set(git("ls-files", "--others", "--exclude-standard")))


def check_working_tree(commit: str, insist: bool, repo: Path = Path(".")) -> str | None:
    """Refuse (WorkingTreeError) when the working tree differs from ``commit`` in what the workers run;
    with ``insist``, return the warning instead."""
    changed = uncommitted_changes(commit, repo)
    if not changed:
        return None
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    what = (f"the working tree differs from the pinned commit {commit[:12]} in {shown}: the workers run the "
            "commit, not these changes")
    if not insist:
        raise WorkingTreeError(f"{what}; commit and push them first (or deploy anyway with --allow-uncommitted)")
    return f"warning: {what} (deploying anyway: --allow-uncommitted)"


@dataclass(frozen=True)
class Deployed:
    deployment_id: UUID
    name: str             # "<flow>/<deployment>", what ``prefect deployment run`` takes
    pool: str
    commit: str


def ensure_pool(client, pool: str) -> bool:  # noqa: ANN001 (prefect's SyncPrefectClient)
    """Create the ``process`` work pool ``pool`` with Prefect's default job template unless it
    exists (of any type: a team may run its own); True when created."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        client.read_work_pool(pool)
        return False
    except ObjectNotFound:
        pass
    try:
        client.create_work_pool(WorkPoolCreate(name=pool, type=POOL_TYPE,
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
        return True
    except ObjectAlreadyExists:   # made in between by another worker starting, or a deploy
        return False


def crash_detection(client, deployment_id: UUID, name: str,  # noqa: ANN001 (SyncPrefectClient)
                    grace_s: int = HEARTBEAT_GRACE_S) -> UUID:
    """Create or update the automation that marks this deployment's runs ``Crashed`` after
    ``HEARTBEAT_S + grace_s`` seconds without a heartbeat (a shorter grace frees the slot sooner; one
    under a few seconds risks crashing a run whose heartbeat is merely late)."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    silent_s = HEARTBEAT_S + grace_s

    automation = AutomationCore(
        name=f"{name}: crashed when heartbeats stop",
        description=f"A flow run of {name} that sent no heartbeat for {silent_s} s "
                    "(its worker was stopped or its host died) is marked Crashed",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            match_related={"prefect.resource.role": "deployment",
                           "prefect.resource.id": f"prefect.deployment.{deployment_id}"},
            for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
            within=timedelta(seconds=silent_s)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {silent_s} s: its worker "
                                            "stopped or its host died")])
    existing = client.read_automations_by_name(automation.name)
    if existing:
        client.update_automation(existing[0].id, automation)
        return existing[0].id
    return client.create_automation(automation)


def deploy(repository: str, commit: str, pool: str, flows: FlowsParams, *, results_branch: str,
           paused: bool = False, crash_grace_s: int = HEARTBEAT_GRACE_S) -> Deployed:
    """Create or update the deployment ``team-retraining/<flows.deployment_name>`` in ``pool``."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.utilities.callables import parameter_schema

    from pipeline.workers.flow import team_retraining
    from pipeline.workers.results import check_branch

    steps = pull_steps(repository, commit)
    check_branch(results_branch)
    with get_client(sync_client=True) as client:
        ensure_pool(client, pool)
        flow_id = client.create_flow_from_name(FLOW_NAME)
        schedule = DeploymentScheduleCreate(schedule=CronSchedule(cron=flows.schedule_cron,
                                                                  timezone=flows.schedule_timezone), active=True)
        deployment_id = client.create_deployment(
            flow_id, flows.deployment_name, version=commit[:12], work_pool_name=pool, entrypoint=ENTRYPOINT,
            pull_steps=steps, parameters={"results_branch": results_branch},
            parameter_openapi_schema=parameter_schema(team_retraining).model_dump_for_openapi(),
            schedules=[schedule], concurrency_limit=1, paused=paused, tags=["retraining", "worker"],
            job_variables={"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}},
            description=f"team-retraining of {repository} at {commit}, results to {results_branch}")
        crash_detection(client, deployment_id, f"{FLOW_NAME}/{flows.deployment_name}", crash_grace_s)
    return Deployed(deployment_id, f"{FLOW_NAME}/{flows.deployment_name}", pool, commit)
