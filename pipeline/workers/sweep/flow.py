"""``team-sweep-point``: one point of a sweep, as a worker runs it in its workspace (the deployment's
pull steps checked out the sweep's commit there: ``pipeline.workers.workspace``).

1. The flow run tags itself with its worker's own queue (``worker-queue:on-<name>``), so that a rerun
   of the sweep sends it back there if it crashes: the checkpoints it leaves are in this workspace.
2. The tracking server answers; the clone's DVC points at the team's remote.
3. The data stages' outputs are pulled from the remote (``dvc pull download references tokenizer``):
   a point never makes them again, and fails with DVC's message if the remote lacks them.
4. The point's overrides are written into params.yaml (comments and order kept, as ``-S`` would) and
   the stages from train on run, forced (``dvc repro --force --no-run-cache --downstream train``: a
   point with the commit's own params would otherwise find them up to date), the sweep's tags in its environment
   (``pipeline.tracking.sweep_point``): its MLflow run is tagged with them, its model logged, not
   registered. A training the same point left here before resumes from its newest checkpoint (the
   train stage's own resume): the checkpoints of other points and of the retraining wait aside
   (``pipeline.workers.checkpoints``), and a pushed point's are dropped. Not ``dvc exp run``: it checks out the
   commit's outputs first, and a train stage the commit's dvc.lock does not record loses its
   checkpoints there.
5. ``dvc exp save -n <sweep>-p<point>``: the workspace as a DVC experiment of the commit, then
   ``dvc exp push --run-cache origin <name>``: its git ref to the repository, its outputs and
   run-cache to the DVC remote.

The deployment's entrypoint (``pipeline/workers/sweep/flow.py:sweep_point``), loaded by path in the
flow run's process from the workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipeline.experiments.sweep_points import DATA_STAGES, QUEUE_TAG, experiment_name
from pipeline.flows.dvc_tasks import run_dvc
from pipeline.flows.pipelines import tracking_uri
from pipeline.tracking.preflight import check_tracking_server
from pipeline.tracking.sweep_point import EXPERIMENT_VAR, OVERRIDES_VAR, POINT_VAR, SWEEP_VAR
from pipeline.workers.checkpoints import drop_checkpoints, take_checkpoints
from pipeline.workers.flow import use_team_remote
from pipeline.workers.queues import current_queue
from pipeline.workers.results import identity_env
from transformer.atomic import write_text

FLOW_NAME = "team-sweep-point"


def tag_with_queue(flow_run_id: str, queue: str) -> None:
    """Add ``worker-queue:<queue>`` to the flow run's tags."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        client.update_flow_run(flow_run_id, tags=sorted({*run.tags, f"{QUEUE_TAG}{queue}"}))


@task(name="dvc pull data", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10)
def pull_data(workdir: str) -> None:
    run_dvc(["pull", *DATA_STAGES], Path(workdir))


def set_params(params_file: Path, overrides: dict[str, Any]) -> None:
    """Write ``section.key: value`` overrides into ``params_file``, its comments, order and quoting
    kept (ruamel's round trip, as DVC's ``-S`` does); atomically."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.representer.add_representer(   # params.yaml writes null, ruamel's default nothing
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null"))
    document = yaml.load(params_file.read_text())
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        if document.get(section) is None:
            document[section] = {}
        document[section][name] = value
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    write_text(params_file, buffer.getvalue())


@task(name="dvc repro", cache_policy=NO_CACHE)
def run_point(workdir: str, overrides: dict[str, Any]) -> None:
    set_params(Path(workdir) / "params.yaml", overrides)
    # Forced from train on: a point whose params are the commit's own would find every stage up to
    # date (or in the run-cache) and leave no run of the sweep's on the server.
    run_dvc(["repro", "--force", "--no-run-cache", "--downstream", "train"], Path(workdir))


@task(name="dvc exp save", cache_policy=NO_CACHE)
def save_point(workdir: str, name: str) -> None:
    """The workspace as the experiment ``name`` (replacing one an earlier attempt saved and did not
    push), with the .gitignore files DVC wrote for the outputs."""
    ignores = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", ":(glob)**/.gitignore"],
                             cwd=workdir, capture_output=True, text=True, check=True).stdout.split()
    run_dvc(["exp", "save", "--force", "-n", name, *[arg for path in ignores for arg in ("-I", path)]], Path(workdir))


@task(name="dvc exp push", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=10)
def push_point(workdir: str, name: str) -> None:
    run_dvc(["exp", "push", "--run-cache", "origin", name], Path(workdir))


@flow(name=FLOW_NAME)
def sweep_point(sweep: str, point: int, overrides: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Run point ``point`` of ``sweep``: ``overrides`` are every ``-S`` it sets (its grid ``values``
    and the phase's fixed ones); its MLflow run is tagged with the sweep, the point and its values."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    root = Path.cwd()
    queue = current_queue()
    if queue:
        tag_with_queue(flow_run.get_id(), queue)
    logger.info("point %d of sweep %s on %s in %s; tracking: %s", point, sweep, queue or "a worker", root,
                check_tracking_server(tracking_uri(root)))
    use_team_remote(str(root))
    name = experiment_name(sweep, point)
    os.environ.update({SWEEP_VAR: sweep, POINT_VAR: str(point), EXPERIMENT_VAR: name,
                       OVERRIDES_VAR: json.dumps(values, sort_keys=True)})
    os.environ.update({k: v for k, v in identity_env().items() if k.startswith("GIT_")})   # the experiment's commit
    pull_data(str(root))
    logger.info("%s", take_checkpoints(root, name))
    run_point(str(root), overrides)
    save_point(str(root), name)
    push_point(str(root), name)
    drop_checkpoints(root)
    return {"sweep": sweep, "point": point, "experiment": name, "values": values}
