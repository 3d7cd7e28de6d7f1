"""Which Prefect API the flows talk to, and serving the retraining flow on its cron schedule.

- ``PREFECT_API_URL`` set (environment or the active Prefect profile): that server (a team
  server, Prefect Cloud). Nothing is started.
- Otherwise a local server on ``127.0.0.1:PREFECT_SERVER_API_PORT`` (default 4200) whose
  database is ``.prefect/prefect.db`` in the repository (unless a
  ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` is set). ``serve`` uses the one already running
  there or starts ``prefect server start`` in the background for as long as it serves (its log:
  ``.prefect/server.log``): Prefect refuses schedules on its temporary "ephemeral" API, whose
  scheduler does not run. ``run`` and ``retrain`` use that server when it is up, else Prefect's
  temporary API on the same database, so every run lands in the same history.

Deployments and their schedules live in that database, so they outlive the serving process:
on a clean stop the runner pauses the deployment (no runs pile up unserved); serving again
updates the same deployment (same id, the schedule from params.yaml) and resumes it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

from pipeline.config.flows import FlowsParams

HOST = "127.0.0.1"
DB_ENV = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")
SERVER_START_TIMEOUT_S = 120


def scheduler_problem() -> str | None:
    """Why a Prefect server run with this environment would not turn schedules into runs, if it
    would not: Prefect 3.8's scheduler bulk-inserts flow runs with a ``state`` key, which
    SQLAlchemy 2.1 rejects for hybrid properties without a ``bulk_dml`` hook (measured: every
    scheduler pass fails with InvalidRequestError "Can't evaluate bulk DML statement")."""
    import sqlalchemy

    major, minor = (int(x) for x in sqlalchemy.__version__.split(".")[:2])
    if (major, minor) >= (2, 1):
        return (f"SQLAlchemy {sqlalchemy.__version__} breaks the Prefect server's scheduler (no scheduled runs "
                "are created); install SQLAlchemy<2.1 (e.g. 2.0.44) in this environment")
    return None


def local_database_url(root: Path) -> str:
    return f"sqlite+aiosqlite:///{root / '.prefect' / 'prefect.db'}"


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def start_local_server(root: Path, port: int) -> subprocess.Popen:
    """``prefect server start`` on 127.0.0.1:``port`` in the background; returns once it answers."""
    home = root / ".prefect"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_SERVER_API_HOST=HOST, PREFECT_SERVER_API_PORT=str(port))
    log = open(home / "server.log", "ab")  # noqa: SIM115 (the server writes it while it runs)
    process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", HOST,
                                "--port", str(port)], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)   # Ctrl-C stops serve first (it pauses), then the server
    log.close()
    url = f"http://{HOST}:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not healthy(url):
        if process.poll() is not None:
            raise RuntimeError(f"prefect server start exited with {process.returncode}; see {home / 'server.log'}")
        if time.monotonic() > deadline:
            stop_local_server(process)
            raise RuntimeError(f"the Prefect server did not answer on {url} within {SERVER_START_TIMEOUT_S} s; "
                               f"see {home / 'server.log'}")
        time.sleep(0.5)
    print(f"Prefect server on http://{HOST}:{port} (UI and API), database under {home}; log {home / 'server.log'}",
          flush=True)
    return process


def stop_local_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def prefect_api(root: Path, start_server: bool) -> Iterator[str]:
    """Use the configured Prefect API, else the local one (see the module docstring); yields its URL
    (``"ephemeral"`` for Prefect's temporary API)."""
    configured = PREFECT_API_URL.value()
    if configured:
        yield configured
        return
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")   # the local server phones no one
    if not any(name in os.environ for name in DB_ENV):
        os.environ[DB_ENV[0]] = local_database_url(root)   # for the server we start or Prefect's temporary one
        (root / ".prefect").mkdir(exist_ok=True)
    port = get_current_settings().server.api.port
    url = f"http://{HOST}:{port}/api"
    server = None
    if not healthy(url):
        if not start_server:
            yield "ephemeral"
            return
        server = start_local_server(root, port)
    if start_server and (problem := scheduler_problem()):
        print(f"warning: {problem}", file=sys.stderr, flush=True)
    os.environ["PREFECT_API_URL"] = url   # flow-run subprocesses of the runner inherit it
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        if server is not None:
            stop_local_server(server)


def retraining_deployment(root: Path, flows: FlowsParams):  # noqa: ANN201 (prefect's RunnerDeployment)
    """The retraining flow as a deployment: the cron schedule of params.yaml, ``workdir`` = ``root``,
    loaded by module path (``pipeline.flows.pipelines.retraining``) in the runner's subprocesses."""
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    from pipeline.flows.pipelines import retraining

    return retraining.to_deployment(
        name=flows.deployment_name, schedule=Cron(flows.schedule_cron, timezone=flows.schedule_timezone),
        parameters={"workdir": str(root)}, entrypoint_type=EntrypointType.MODULE_PATH, tags=["retraining"],
        concurrency_limit=1,   # one DVC workspace, one writer: a run due while another runs waits for it
        description="Scheduled retraining with the champion/challenger gate (pipeline/flows, params.yaml flows)")


def serve_retraining(root: Path, flows: FlowsParams, run_once: bool = False) -> UUID:
    """Create or update the deployment and serve it (poll for its scheduled runs and run them)
    until stopped; ``run_once`` polls once and returns (tests). Returns the deployment's id."""
    from prefect.runner import Runner

    deployment = retraining_deployment(root, flows)
    runner = Runner(name=f"{flows.deployment_name}-runner", pause_on_shutdown=True, limit=1)

    async def serve() -> UUID:
        deployment_id = await runner.aadd_deployment(deployment)
        print(f"serving deployment 'retraining/{flows.deployment_name}' ({deployment_id}): cron "
              f"{flows.schedule_cron!r} ({flows.schedule_timezone}); run it now with: prefect deployment run "
              f"'retraining/{flows.deployment_name}'", flush=True)
        await runner.start(run_once=run_once)
        return deployment_id

    return asyncio.run(serve())
