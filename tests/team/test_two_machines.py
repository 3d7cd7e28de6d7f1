"""A team of two machines on the stack: the first runs the pipeline (tiny preset) with the stack's
env, logs and registers on the MLflow server, pushes to the S3 remote; the second, a fresh clone
with only the env file, pulls: ``dvc status`` is clean, ``dvc repro`` runs no stage and makes no
MLflow run, ``compare`` lists the first machine's runs, and ``serve-model`` serves the champion."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ..pipeline.conftest import BIN, MIRROR, make_workspace, orchestration_params
from .conftest import PYTHON, Stack, server_client

pytestmark = pytest.mark.service

EXPERIMENT, MODEL = "team-test", "team-translator"


@dataclass
class Machine:
    path: Path
    env: dict[str, str] = field(repr=False)   # holds credentials: never in a test report
    log: str = field(default="", repr=False)

    def run(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=self.path, env=self.env, capture_output=True, text=True, timeout=timeout)

    def dvc(self, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return self.run(str(BIN / "dvc"), *args, timeout=timeout)


def sourced(env_file: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment after ``source env_file``, as a user's shell has it."""
    printed = subprocess.run(["bash", "-c", f"set -a; source {shlex.quote(str(env_file))}; env -0"],
                             env=base, capture_output=True, check=True).stdout
    return dict(item.split("=", 1) for item in printed.decode().split("\0") if "=" in item)


def experiment_runs(client: MlflowClient) -> list[str]:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return [r.info.run_id for r in client.search_runs([experiment.experiment_id])] if experiment else []


@pytest.fixture(scope="module")
def machines(stack: Stack, tmp_path_factory) -> tuple[Machine, Machine]:
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    params = orchestration_params({"tracking": {"experiment": EXPERIMENT, "registered_model": MODEL}})
    root, env = make_workspace(tmp_path_factory.mktemp("first") / "repo", params)
    env.pop("MLFLOW_TRACKING_URI")   # the stack's env file names the server
    first = Machine(root, sourced(stack.directory / "env", env))
    remote = first.run(PYTHON, "-m", "pipeline.stack", "remote")
    assert remote.returncode == 0, remote.stderr
    repro = first.dvc("repro")
    assert repro.returncode == 0, repro.stdout[-3000:] + repro.stderr[-3000:]
    first.log = repro.stdout + repro.stderr
    first.run("git", "add", "-A")
    first.run("git", "commit", "-qm", "first machine's run")
    started = time.monotonic()
    push = first.dvc("push")
    print(f"dvc push: {time.monotonic() - started:.1f} s")
    assert push.returncode == 0, push.stdout + push.stderr

    # The second machine: a fresh clone, the env file and nothing else (no cache, no mlflow.db).
    second_root = tmp_path_factory.mktemp("second") / "repo"
    subprocess.run(["git", "clone", "-q", str(root), str(second_root)], check=True)
    second_env = sourced(stack.directory / "env", {k: v for k, v in env.items()})
    second = Machine(second_root, second_env)
    assert second.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
    return first, second


def test_the_first_machine_logs_and_registers_on_the_server(machines, stack, monkeypatch):
    first, _ = machines
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, first.env[key])
    client = server_client(first.env["MLFLOW_TRACKING_URI"])
    runs = experiment_runs(client)
    assert len(runs) == 1
    run = client.get_run(runs[0])
    assert run.info.status == "FINISHED" and "valid_bleu" in run.data.metrics
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")   # proxied: the client holds no S3 keys
    versions = client.search_model_versions(f"name = '{MODEL}'")
    assert len(versions) == 1, first.log[-4000:]
    version = versions[0]
    assert version.run_id == runs[0]
    assert not (first.path / "mlflow.db").exists() and not (first.path / "mlartifacts").exists()
    # The artifacts lie in the store's bucket, put there by the server.
    listed = first.run(str(BIN / "python"), "-c", "import boto3,os;print(sum(1 for _ in boto3.resource('s3', "
                       "endpoint_url=os.environ['TEAM_S3_ENDPOINT_URL']).Bucket('mlflow').objects.all()))")
    assert int(listed.stdout) > 5, listed.stderr


def test_the_second_machine_pulls_and_reruns_nothing(machines, monkeypatch):
    first, second = machines
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, first.env[key])
    client = server_client(first.env["MLFLOW_TRACKING_URI"])
    runs_before = experiment_runs(client)
    started = time.monotonic()
    pull = second.dvc("pull")
    print(f"dvc pull: {time.monotonic() - started:.1f} s")
    assert pull.returncode == 0, pull.stdout + pull.stderr
    status = second.dvc("status")
    assert status.returncode == 0 and "Data and pipelines are up to date" in status.stdout, status.stdout
    repro = second.dvc("repro")
    assert repro.returncode == 0, repro.stdout + repro.stderr
    assert "Running stage" not in repro.stdout, repro.stdout
    for stage in ("download", "tokenizer", "train", "average", "tune", "evaluate"):
        assert f"Stage '{stage}' didn't change, skipping" in repro.stdout
    for path in ("models/model.pt", "reports/metrics.json", "data/tokenizer/spm.model", "reports/tune.json"):
        assert (second.path / path).read_bytes() == (first.path / path).read_bytes(), path
    assert experiment_runs(client) == runs_before
    assert second.run("git", "status", "--porcelain").stdout == ""


def test_the_second_machine_compares_the_servers_runs(machines, monkeypatch):
    first, second = machines
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, first.env[key])
    (run_id,) = experiment_runs(server_client(first.env["MLFLOW_TRACKING_URI"]))
    result = second.run(PYTHON, "-m", "pipeline.experiments.compare")
    assert result.returncode == 0, result.stderr
    assert f"| {run_id[:8]} |" in result.stdout and "FINISHED" in result.stdout, result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_second_machine_serves_the_champion_from_the_server(machines, monkeypatch):
    first, second = machines
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, first.env[key])
    client = server_client(first.env["MLFLOW_TRACKING_URI"])
    version = client.search_model_versions(f"name = '{MODEL}'")[0].version
    client.set_registered_model_alias(MODEL, "champion", version)   # by hand, as the gate would
    port = _free_port()
    server = subprocess.Popen([PYTHON, "-m", "pipeline.serving.server", "--port", str(port)],   # make serve-model
                              cwd=second.path, env=second.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, server.stdout.read()
                time.sleep(0.5)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", method="POST",
                                         data=json.dumps({"dataframe_records": [{"text": "A dog runs."}]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            predictions = json.loads(response.read())["predictions"]
        assert len(predictions) == 1 and isinstance(predictions[0], str)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output, _ = server.communicate(timeout=30)
    assert f"serving {MODEL} version {version} (alias champion" in output
    assert "stopped: the queue is answered" in output
