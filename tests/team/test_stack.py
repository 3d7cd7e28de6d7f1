"""``python -m pipeline.stack``: start, status, a second start, secrets, taken ports, stop and a
restart on the data left, with the real services."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from mlflow.tracking import MlflowClient

from pipeline.stack.processes import pid_alive, port_taken, read_pid
from pipeline.stack.settings import PORT_OFFSETS, StackSettings

from ..pipeline.conftest import BIN
from .conftest import Stack, server_client, stack_cli_env

pytestmark = pytest.mark.service

SERVICES = ("postgres", "s3", "mlflow", "prefect")


def recorded_pids(stack: Stack) -> dict[str, int]:
    return {name: read_pid(stack.directory / "run" / f"{name}.pid") for name in SERVICES}


def mlflow_client(stack: Stack, monkeypatch) -> MlflowClient:
    for key, value in stack.client_env.items():
        monkeypatch.setenv(key, value)
    return server_client(stack.client_env["MLFLOW_TRACKING_URI"])


def test_status_says_every_service_answers(stack):
    result = stack.cli("status")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()}
    assert lines == dict.fromkeys(SERVICES, "ok")
    assert "buckets dvc, mlflow" in result.stdout


def test_a_second_start_is_a_no_op_that_says_so(stack):
    before = recorded_pids(stack)
    result = stack.cli("start")
    assert result.returncode == 0 and "already running" in result.stdout and "nothing to do" in result.stdout
    assert recorded_pids(stack) == before


def test_start_in_a_dvc_clone_points_that_clone_at_the_stack_remote(stack, tmp_path):
    """``make stack`` run in a clone: its DVC's default remote becomes the stack's S3 bucket, in
    the git-ignored ``.dvc/config.local``; the keys stay out of the file (the env file has them)."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for argv in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(argv, cwd=clone, check=True, capture_output=True)
    result = stack.cli("start", cwd=clone)
    assert result.returncode == 0, result.stdout + result.stderr
    env = stack.client_env
    endpoint = env["TEAM_S3_ENDPOINT_URL"]
    assert f"DVC remote 'team' (default, in .dvc/config.local): s3://dvc/pipeline at {endpoint}" in result.stdout
    config = (clone / ".dvc" / "config.local").read_text()
    assert "remote = team" in config and f"endpointurl = {endpoint}" in config
    assert env["AWS_SECRET_ACCESS_KEY"] not in config and env["AWS_ACCESS_KEY_ID"] not in config


def test_secrets_are_generated_private_and_on_no_command_line(stack):
    secret_dir = stack.directory / "secrets"
    assert stat.S_IMODE(secret_dir.stat().st_mode) == 0o700
    for path in (stack.directory / "env", *secret_dir.rglob("*")):   # weed-tls/: the store's gRPC certificates
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    secrets = json.loads((secret_dir / "secrets.json").read_text())
    assert len(set(secrets.values())) == len(secrets) and min(map(len, secrets.values())) >= 20
    env_text = (stack.directory / "env").read_text()
    assert secrets["mlflow_admin_password"] in env_text and "MLFLOW_TRACKING_URI" in env_text
    # No secret in any process's command line (what `ps` shows every user).
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(value in text for value in secrets.values()), cmdline


def test_wrong_mlflow_credentials_are_refused(stack, monkeypatch):
    client = mlflow_client(stack, monkeypatch)
    assert client.search_experiments() is not None
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    try:
        client.search_experiments()
    except Exception as err:   # noqa: BLE001 - MlflowException or HTTPError, by version
        assert "401" in str(err) or "Unauthorized" in str(err) or "credentials" in str(err).lower()
    else:
        raise AssertionError("the server accepted a wrong password")


def test_stop_waits_for_every_process_and_a_restart_keeps_the_data(stack, monkeypatch):
    client = mlflow_client(stack, monkeypatch)
    experiment = client.create_experiment(f"survives-restart-{os.getpid()}")
    env = stack.client_env
    s3 = boto3.client("s3", endpoint_url=env["TEAM_S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    s3.put_object(Bucket="dvc", Key="restart-check", Body=b"kept")
    pids = recorded_pids(stack)

    stopped = stack.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert [line.split()[1] for line in stopped.stdout.splitlines()] == ["stopped"] * 4
    assert not any(pid_alive(pid) for pid in pids.values())
    assert not any(port_taken("127.0.0.1", stack.port_base + offset) for offset in PORT_OFFSETS.values())
    status = stack.cli("status")
    assert status.returncode == 1 and status.stdout.count(" down ") == 4

    started = stack.cli("start")
    assert started.returncode == 0, started.stdout + started.stderr
    assert set(recorded_pids(stack).values()).isdisjoint(pids.values())
    assert client.get_experiment(experiment).name.startswith("survives-restart-")
    assert s3.get_object(Bucket="dvc", Key="restart-check")["Body"].read() == b"kept"


def test_a_prefect_flow_runs_on_the_stacks_server_and_a_wrong_auth_string_is_refused(stack, tmp_path):
    code = ("from prefect import flow\n@flow(name='stack-check')\ndef add_one(x: int) -> int:\n    return x + 1\n"
            "print('result', add_one(41))\n")
    prefect_vars = {k: v for k, v in stack.client_env.items() if k.startswith("PREFECT_")}
    env = {**stack_cli_env(), **prefect_vars, "PREFECT_HOME": str(tmp_path / "home")}
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0 and "result 42" in ran.stdout, ran.stdout + ran.stderr
    listed = subprocess.run([str(Path(sys.executable).parent / "prefect"), "flow-run", "ls", "--state", "COMPLETED"],
                            env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "stack-check" in listed.stdout, listed.stdout + listed.stderr
    wrong = subprocess.run([sys.executable, "-c", code], env={**env, "PREFECT_API_AUTH_STRING": "admin:wrong"},
                           capture_output=True, text=True, timeout=180)
    assert wrong.returncode != 0 and "401" in wrong.stdout + wrong.stderr


def test_mlflow_users_and_permissions_as_docs_team_md_says(stack, monkeypatch):
    from mlflow.server import get_app_client

    admin = mlflow_client(stack, monkeypatch)
    uri = stack.client_env["MLFLOW_TRACKING_URI"]
    granted = admin.create_experiment(f"alice-may-edit-{os.getpid()}")
    other = admin.create_experiment(f"alice-may-read-{os.getpid()}")
    auth = get_app_client("basic-auth", tracking_uri=uri)
    auth.create_user(f"alice{os.getpid()}", "a-long-password-1234")
    auth.grant_user_permission(f"alice{os.getpid()}", "experiment", granted, "EDIT")

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", f"alice{os.getpid()}")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "a-long-password-1234")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    alice = server_client(uri)
    assert alice.create_run(granted).info.status == "RUNNING"
    assert alice.get_experiment(other).name.startswith("alice-may-read-")   # default_permission READ
    try:
        alice.create_run(other)
    except Exception as err:   # noqa: BLE001
        assert "403" in str(err) or "PERMISSION_DENIED" in str(err), err
    else:
        raise AssertionError("a READ user could write")


def test_mlflow_answers_only_the_host_names_it_allows(stack):
    """``--allowed-hosts``: the stack's address, localhost and STACK_ALLOWED_HOSTS; any other Host
    header (DNS rebinding) gets 403."""
    import base64
    import http.client

    port = stack.settings.port("mlflow")
    env = stack.client_env
    token = base64.b64encode(f"{env['MLFLOW_TRACKING_USERNAME']}:{env['MLFLOW_TRACKING_PASSWORD']}".encode())

    def status_for(host_header: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/api/2.0/mlflow/experiments/search?max_results=1",
                     headers={"Host": host_header, "Authorization": f"Basic {token.decode()}"})
        return conn.getresponse().status

    assert status_for(f"127.0.0.1:{port}") == 200
    assert status_for(f"localhost:{port}") == 200
    assert status_for(f"rebinding.example:{port}") == 403


def test_another_address_and_host_names_reach_the_servers_command_lines(tmp_path):
    from pipeline.stack.mlflow_service import MlflowServer
    from pipeline.stack.objectstore import ObjectStore
    from pipeline.stack.postgres import Postgres
    from pipeline.stack.secrets import StackSecrets

    settings = StackSettings(directory=tmp_path, host="10.23.0.1", port_base=30000, allowed_hosts=("team-a",))
    secrets = StackSecrets.generate()
    mlflow_argv = MlflowServer(settings, secrets).argv(Postgres(settings, secrets))
    assert mlflow_argv[mlflow_argv.index("--host") + 1] == "10.23.0.1"
    allowed = mlflow_argv[mlflow_argv.index("--allowed-hosts") + 1].split(",")
    assert {"10.23.0.1:30002", "team-a", "team-a:30002", "localhost:30002"} <= set(allowed)
    weed = ObjectStore(settings, secrets).argv(Path("/bin/weed"))
    assert "-ip.bind=10.23.0.1" in weed and "-s3.port=30001" in weed
    assert all(f"={p}" in " ".join(weed) for p in range(30010, 30017))   # every internal port named
    assert Postgres(settings, secrets).url("mlflow", "mlflow") == "postgresql://mlflow@10.23.0.1:30000/mlflow"
