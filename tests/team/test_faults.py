"""Faults with the real services: the S3 store stopped during ``dvc push``, PostgreSQL restarted
under the MLflow server, wrong or missing credentials. The MLflow server killed during training:
``test_tracking_faults.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import boto3
import pytest
from mlflow.tracking import MlflowClient

from pipeline.stack.groups import read_record
from pipeline.stack.postgres import Postgres
from pipeline.stack.processes import stop_pid
from pipeline.stack.secrets import load_or_create

from ..pipeline.conftest import MIRROR, make_workspace, orchestration_params
from .conftest import PYTHON, Stack, server_client
from .test_two_machines import Machine, sourced

pytestmark = pytest.mark.service


def machine(stack: Stack, root, params: dict) -> Machine:
    path, env = make_workspace(root, params)
    env.pop("MLFLOW_TRACKING_URI")
    m = Machine(path, sourced(stack.directory / "env", env))
    assert m.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
    return m


def client_for(m: Machine, monkeypatch) -> MlflowClient:
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, m.env[key])
    return server_client(m.env["MLFLOW_TRACKING_URI"])


def kill_service(stack: Stack, name: str) -> None:
    """SIGKILL to the service's process group: a crash, not a shutdown."""
    record = read_record(stack.directory / "run" / f"{name}.pid")   # the leader's PID and its start's tag
    assert record is not None, f"{name} recorded no PID"
    stop_pid(record.pid, signal.SIGKILL)


def restart(stack: Stack) -> None:
    started = stack.cli("start")
    assert started.returncode == 0, started.stdout + started.stderr


@pytest.fixture()
def needs_mirror():
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")


def test_s3_store_stopped_during_push_loses_nothing_and_the_next_push_completes(stack, tmp_path):
    m = machine(stack, tmp_path / "repo", orchestration_params())
    blobs = m.path / "blobs"
    blobs.mkdir()
    for i in range(300):
        (blobs / f"{i:03d}.bin").write_bytes(os.urandom(100_000))
    assert m.dvc("add", "blobs").returncode == 0
    env = m.env
    s3 = boto3.resource("s3", endpoint_url=env["TEAM_S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    before = sum(1 for _ in s3.Bucket("dvc").objects.all())
    push = subprocess.Popen([PYTHON, "-m", "pipeline.stack", "push"], cwd=m.path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while sum(1 for _ in s3.Bucket("dvc").objects.all()) == before:   # the push has begun
            assert push.poll() is None and time.monotonic() < deadline, push.stdout.read()
            time.sleep(0.05)
        kill_service(stack, "s3")
        started = time.monotonic()
        output, errors = push.communicate(timeout=300)
        print(f"push failed {time.monotonic() - started:.1f} s after the store stopped")
    finally:
        if push.poll() is None:
            push.kill()
        restart(stack)
    assert push.returncode == 2, output + errors
    assert errors.count("\n") == 1 and "ERROR: failed to transfer" not in output + errors, errors
    assert errors.startswith("error: dvc push with remote 'team' (s3://dvc/pipeline at http://127.0.0.1:"), errors
    assert "nothing local was lost" in errors
    local = m.dvc("status", "blobs.dvc")   # the workspace and the cache agree: nothing was lost locally
    assert "Data and pipelines are up to date" in local.stdout, local.stdout
    again = m.run(PYTHON, "-m", "pipeline.stack", "push")
    assert again.returncode == 0, again.stdout + again.stderr
    cloud = m.dvc("status", "--cloud", "blobs.dvc")
    assert "Cache and remote 'team' are in sync" in cloud.stdout, cloud.stdout


def test_postgres_restarted_under_the_mlflow_server(stack, monkeypatch):
    secrets = load_or_create(stack.directory / "secrets")
    for key, value in stack.client_env.items():
        monkeypatch.setenv(key, value)
    client = server_client(stack.client_env["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment(f"pg-restart-{os.getpid()}")
    postgres = Postgres(stack.settings, secrets)
    assert postgres.stop()
    started = stack.cli("start")   # starts what is not running: PostgreSQL alone
    assert started.returncode == 0 and started.stdout.count("already running") == 3, started.stdout
    run = client.create_run(experiment)   # the next requests succeed
    client.log_metric(run.info.run_id, "m", 1.0)
    assert client.get_metric_history(run.info.run_id, "m")[0].value == 1.0
    assert stack.cli("status").returncode == 0


def test_wrong_or_missing_credentials_are_one_clear_error_and_nothing_is_written(stack, tmp_path, monkeypatch):
    params = orchestration_params({"tracking": {"experiment": "creds", "registered_model": "c"}})
    m = machine(stack, tmp_path / "repo", params)
    client = client_for(m, monkeypatch)
    experiments = len(client.search_experiments())
    for env in ({**m.env, "MLFLOW_TRACKING_PASSWORD": "wrong"},
                {k: v for k, v in m.env.items() if not k.startswith("MLFLOW_TRACKING_USERNAME")}):
        result = subprocess.run([PYTHON, "-m", "pipeline.tracking.preflight"], cwd=m.path, env=env,
                                capture_output=True, text=True)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert "401" in result.stderr and "MLFLOW_TRACKING_PASSWORD" in result.stderr
        assert m.env["MLFLOW_TRACKING_PASSWORD"] not in result.stderr + result.stdout
        flow = subprocess.run([PYTHON, "-m", "pipeline.flows", "run"], cwd=m.path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert flow.returncode == 2 and "401" in flow.stderr, flow.stdout + flow.stderr
    assert len(client.search_experiments()) == experiments
    assert not (m.path / "models").exists() and not (m.path / "mlflow.db").exists()

    # Wrong S3 keys: dvc push fails naming the remote, and writes nothing.
    (m.path / "file.txt").write_text("x" * 1000)
    assert m.dvc("add", "file.txt").returncode == 0
    push = subprocess.run([PYTHON, "-m", "pipeline.stack", "push"], cwd=m.path,
                          env={**m.env, "AWS_SECRET_ACCESS_KEY": "wrong"}, capture_output=True, text=True, timeout=300)
    assert push.returncode == 2 and push.stderr.count("\n") == 1, push.stdout + push.stderr
    assert push.stderr.startswith("error: dvc push with remote 'team' (s3://dvc/pipeline"), push.stderr
    assert m.dvc("status", "--cloud", "file.txt.dvc").stdout.count("new:") == 1   # not on the remote
