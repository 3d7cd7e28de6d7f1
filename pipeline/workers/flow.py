"""``team-retraining``: the retraining flow as a worker runs it, in its workspace (the deployment's
pull steps chose the folder and the commit: ``pipeline.workers.workspace``).

1. The tracking server answers (``pipeline.tracking.preflight``), before any work.
2. The clone's DVC points at the team's remote (``TEAM_DVC_REMOTE_URL``, from the stack's env file);
   the retraining's own checkpoints are in place (a sweep's point may have run in this workspace:
   ``pipeline.workers.checkpoints``).
3. ``retraining``: incoming data, the DVC stages (each pulls from the remote first, so what another
   machine already made is restored, not rerun), the promotion gate on the tracking server.
4. ``dvc push --run-cache``: everything the run made, for the next machine.
5. ``dvc.lock`` and friends committed to ``results_branch`` of the repository and pushed
   (``pipeline.workers.results``).

This file is the deployment's entrypoint (``pipeline/workers/flow.py:team_retraining``), loaded by
path in the flow run's process: its imports are absolute, from the workspace (Prefect puts the
working directory on ``sys.path``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipeline.flows.dvc_tasks import RETRIES, run_dvc
from pipeline.flows.pipelines import retraining, tracking_uri
from pipeline.stack.client_env import REMOTE_URL_VAR
from pipeline.stack.remote import configure_remote
from pipeline.tracking.preflight import check_tracking_server
from pipeline.workers.checkpoints import RETRAINING, take_checkpoints
from pipeline.workers.results import Published, check_branch, publish

DEFAULT_BRANCH = "retraining/results"


@task(name="team remote", cache_policy=NO_CACHE)
def use_team_remote(workdir: str) -> str:
    """Point the clone's DVC at the team's remote named by the worker's environment."""
    if not os.environ.get(REMOTE_URL_VAR):
        raise RuntimeError(f"{REMOTE_URL_VAR} is not set in the worker's environment: start the worker with "
                           "the team's env file sourced (docs/team.md)")
    summary = configure_remote(Path(workdir))
    get_run_logger().info("%s", summary)
    return summary


@task(name="dvc push", cache_policy=NO_CACHE, retries=RETRIES["dvc add"][0],
      retry_delay_seconds=RETRIES["dvc add"][1])
def push_outputs(workdir: str) -> None:
    """Data, models, reports and the stages' run-cache to the remote (a retry sends what is left)."""
    run_dvc(["push", "--run-cache"], Path(workdir))


@task(name="publish results", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=10)
def publish_results(workdir: str, branch: str, message: str) -> Published:
    published = publish(Path(workdir), branch, message)
    logger = get_run_logger()
    if published.commit:
        logger.info("results %s pushed to %s (%s)", published.commit[:12], branch, ", ".join(published.changed))
    else:
        logger.info("nothing new to commit: %s already holds this run's dvc.lock", branch)
    return published


@flow(name="team-retraining")
def team_retraining(results_branch: str = DEFAULT_BRANCH) -> dict[str, Any]:
    """Retrain in the worker's workspace, push what was made to the DVC remote and the result's
    ``dvc.lock`` to ``results_branch``; the gate moves ``champion`` on the tracking server."""
    from prefect.runtime import flow_run

    check_branch(results_branch)
    root = Path.cwd()
    logger = get_run_logger()
    logger.info("workspace %s; tracking: %s", root, check_tracking_server(tracking_uri(root)))
    use_team_remote(str(root))
    logger.info("%s", take_checkpoints(root, RETRAINING))   # a sweep's point may have run here since
    summary = retraining(workdir=str(root))
    push_outputs(str(root))
    published = publish_results(str(root), results_branch,
                                f"retraining {flow_run.get_name() or ''}: {summary.get('verdict', '')}\n\n"
                                f"Prefect flow run {flow_run.get_id() or ''}")
    return {**summary, "results_branch": results_branch, "results_commit": published.commit,
            "code_commit": published.base}
