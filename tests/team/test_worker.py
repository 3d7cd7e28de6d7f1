"""The retraining flow on a worker on a second host, end to end against the stack.

The first machine (the root namespace) runs the stack bound to a bridge's address, serves the
project's git repository with ``git daemon``, makes the download and tokenizer stages, pushes them
and their ``dvc.lock``, and deploys ``team-retraining`` pinned to that commit
(``python -m pipeline.workers deploy``). A worker (``prefect worker start``) on the second host,
a network namespace with its own address and hostname, runs the deployment: it clones the
repository into its workspace, pulls what the first machine made instead of rerunning it,
trains, logs and registers on the MLflow server (the gate makes it champion), pushes to the S3
remote and commits ``dvc.lock`` to a branch that a colleague fetches and pulls. (A worker stopped in
the middle of a training, its flow run crashed and resumed on the same workspace: ``test_sweep_pool``,
whose points run on workers the same way.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..pipeline.conftest import BIN, MIRROR, TINY, make_workspace, orchestration_params
from . import hosts
from .conftest import PYTHON, Stack, running_stack, server_client, skip_without_second_hosts
from .test_two_machines import Machine, sourced

pytestmark = pytest.mark.service

EXPERIMENT, MODEL, POOL, BRANCH = "worker-test", "worker-translator", "test-gpu-pool", "retraining/worker-a"
DEPLOYMENT = "team-retraining/scheduled-retraining"
HERE = Path(__file__).resolve().parent
TRAIN = {"max_epochs": 0, "max_steps": 60, "checkpoint_every_steps": 20, "validate_every": 30, "log_every": 20}
FLOW_RUN_TIMEOUT_S = 420
CRASH_GRACE_S = 10   # a stopped worker's run is Crashed 40 s after its last heartbeat, not 75


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def made_and_pushed(first: Machine, *stages: str) -> tuple[Machine, str]:
    """The first machine makes ``stages`` (and what they need), pushes them to the stack's remote and
    commits the result: the machine, and the commit."""
    assert first.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
    made = first.dvc("repro", *stages)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    pushed = first.dvc("push")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    first.run("git", "add", "-A")
    first.run("git", "commit", "-qm", f"{', '.join(stages)}, made on the first machine")
    return first, first.run("git", "rev-parse", "HEAD").stdout.strip()


def serve_repository(root: Path, bare: Path, address: str) -> tuple[subprocess.Popen, str]:
    """A bare clone of ``root`` at ``bare``, served by ``git daemon`` on ``address`` (pushes allowed):
    the daemon, and the repository's URL."""
    subprocess.run(["git", "clone", "-q", "--bare", str(root), str(bare)], check=True)
    port = free_port(address)
    daemon = subprocess.Popen(["git", "daemon", "--reuseaddr", "--export-all", "--enable=receive-pack",
                               f"--base-path={bare.parent}", f"--listen={address}", f"--port={port}",
                               str(bare.parent)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(address, port)
    except BaseException:
        stop(daemon)
        raise
    return daemon, f"git://{address}:{port}/{bare.name}"


@dataclass
class Team:
    network: hosts.Network
    stack: Stack
    first: Machine
    repository: str       # git://<bridge address>:<port>/translator.git
    bare: Path
    commit: str
    tmp: Path
    prefect_env: dict[str, str] = field(repr=False)

    def prefect(self, *args: str, timeout: float = 60) -> object:
        result = subprocess.run([PYTHON, str(HERE / "prefect_runs.py"), *args], env=self.prefect_env,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class Worker:
    process: subprocess.Popen
    workspace: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def clean_env(home: Path) -> dict[str, str]:
    """What a fresh login on a worker host has: the venv on PATH, nothing of the test's settings."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("MLFLOW_", "PREFECT_", "AWS_", "STACK_", "DVC_", "TEAM_", "GIT_", "PYTHONPATH"))}
    home.mkdir(parents=True, exist_ok=True)
    keep.update(PATH=f"{BIN}{os.pathsep}{keep.get('PATH', '')}", HOME=str(home), OMP_NUM_THREADS="1",
                PREFECT_HOME=str(home / ".prefect"), DATA_MIRROR=str(MIRROR), PYTHONUNBUFFERED="1")
    return keep


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Iterator[Team]:
    skip_without_second_hosts()
    tmp = tmp_path_factory.mktemp("worker")
    with hosts.Network(("worker-a",)) as network, running_stack(network.server_address) as stack:
        params = orchestration_params({"train": {**TINY["train"], **TRAIN},
                                       "tracking": {"experiment": EXPERIMENT, "registered_model": MODEL}})
        root, env = make_workspace(tmp / "first" / "repo", params)
        env.pop("MLFLOW_TRACKING_URI")
        first, commit = made_and_pushed(Machine(root, sourced(stack.directory / "env", env)), "tokenizer")

        bare = tmp / "git" / "translator.git"
        daemon, repository = serve_repository(root, bare, network.server_address)
        try:
            prefect_env = {**clean_env(tmp / "deployer"),
                           **{k: v for k, v in first.env.items() if k.startswith("PREFECT_API")}}
            deployed = subprocess.run([PYTHON, "-m", "pipeline.workers", "deploy", "--repository", repository,
                                       "--pool", POOL, "--results-branch", BRANCH, "--crash-grace",
                                       str(CRASH_GRACE_S)], cwd=root,
                                      env={**prefect_env, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                                      timeout=120)
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            assert commit in deployed.stdout
            yield Team(network, stack, first, repository, bare, commit, tmp, prefect_env)
        finally:
            stop(daemon)



def start_worker(team: Team, name: str) -> Worker:
    """``python -m pipeline.workers start`` (``prefect worker start`` with SIGINT at its default
    action: under ``make test > log &`` the suite has SIGINT ignored, and a plain Prefect worker would
    never stop) on the second host, in a session of its own, with the stack's env file sourced and a
    workspace folder of its own."""
    home = team.tmp / name
    env = sourced(team.stack.directory / "env", clean_env(home))
    env.update(TEAM_WORKSPACE=str(home / "workspace"), PREFECT_WORKER_QUERY_SECONDS="2")
    log = home / "worker.log"
    with log.open("ab") as sink:
        process = team.network.hosts["worker-a"].popen(
            [PYTHON, "-m", "pipeline.workers", "start", "--pool", POOL, "--name", name, "--limit", "1"], cwd=home,
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return Worker(process, home / "workspace", log)


def descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [grandchild for child in children for grandchild in [child, *descendants(child)]]


@pytest.fixture(scope="module")
def first_run(team: Team) -> tuple[Worker, dict, list[str], float]:
    """One run of the deployment by a worker, which stops afterwards (the pool then has no worker)."""
    worker = start_worker(team, "worker-1")
    try:
        started = time.monotonic()
        run = team.prefect("start", DEPLOYMENT)
        state = team.prefect("wait", run["id"], str(FLOW_RUN_TIMEOUT_S), timeout=FLOW_RUN_TIMEOUT_S + 60)
        elapsed = time.monotonic() - started
        logs = team.prefect("logs", run["id"])
    finally:
        stop(worker.process, signal.SIGINT)
    print(f"worker run of the tiny pipeline: {elapsed:.0f} s")
    assert state["type"] == "COMPLETED", f"{state}\n{worker.output()[-4000:]}\n" + "\n".join(logs[-40:])
    return worker, state, logs, elapsed


def test_worker_on_a_second_host_runs_the_deployment_pulls_trains_and_publishes(team, first_run, monkeypatch):
    worker, _, logs, _ = first_run
    text = "\n".join(logs)
    # It ran on the second host, in its own workspace, at the pinned commit.
    assert f"workspace {worker.workspace} at {team.commit}" in worker.output() + text
    assert (worker.workspace / ".git").is_dir() and (worker.workspace / ".dvc" / "cache").is_dir()
    # What the first machine made was pulled, not made again; the rest ran here.
    for stage in ("download", "tokenizer"):
        assert f"Running stage '{stage}'" not in text, text[-3000:]
    for stage in ("train", "average", "tune", "evaluate"):
        assert f"Running stage '{stage}'" in text, text[-3000:]

    # The gate promoted the worker's model on the tracking server; its run names the pinned commit.
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, team.first.env[key])
    client = server_client(team.first.env["MLFLOW_TRACKING_URI"])
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert client.get_run(champion.run_id).data.tags["git.commit"] == team.commit

    # The results branch: on top of the pinned commit, by the worker host, holding the whole dvc.lock.
    git = ["git", f"--git-dir={team.bare}"]
    tip = subprocess.run([*git, "rev-parse", f"refs/heads/{BRANCH}"], capture_output=True, text=True, check=True)
    tip_sha = tip.stdout.strip()
    parents = subprocess.run([*git, "log", "-1", "--format=%P%n%an", tip_sha], capture_output=True, text=True,
                             check=True).stdout.split("\n")
    assert parents[0].split()[0] == team.commit and "worker-a" in parents[1]
    lock = subprocess.run([*git, "show", f"{tip_sha}:dvc.lock"], capture_output=True, text=True, check=True).stdout
    assert all(f"  {stage}:" in lock for stage in ("train", "average", "tune", "evaluate"))

    # A colleague fetches the branch and pulls exactly that result.
    colleague = team.tmp / "colleague"
    subprocess.run(["git", "clone", "-q", "--branch", BRANCH, team.repository, str(colleague)], check=True)
    machine = Machine(colleague, team.first.env)
    assert machine.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
    pulled = machine.dvc("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    status = machine.dvc("status")
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    for path in ("models/model.pt", "reports/metrics.json"):
        assert (colleague / path).read_bytes() == (worker.workspace / path).read_bytes(), path


def test_worker_deployment_is_scheduled_one_run_at_a_time(team, first_run):
    deadline = time.monotonic() + 90   # Prefect's scheduler service makes the cron's runs within a minute
    while not (scheduled := team.prefect("scheduled", DEPLOYMENT)) and time.monotonic() < deadline:
        time.sleep(3)
    assert scheduled, "the server's scheduler made no run of the deployment's cron"
    deployment = team.prefect("deployment", DEPLOYMENT)
    assert deployment["concurrency_limit"] == 1, deployment
    assert deployment["schedules"] == ["0 3 * * 1"] and deployment["work_pool_name"] == POOL
    assert deployment["version"] == team.commit[:12] and deployment["parameters"] == {"results_branch": BRANCH}
    assert team.commit in json.dumps(deployment["pull_steps"])
