"""The stack manages its process trees: a service killed with ``kill -9`` (its leader only) leaves
its workers running and holding its port; ``status`` says so, ``stop`` and the next ``start`` end
them by the recorded process group (never by name). And a refused start writes nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.stack.groups import read_record, tagged_members
from pipeline.stack.processes import pid_alive, port_taken
from pipeline.stack.settings import PORT_OFFSETS

from .conftest import Stack, free_port_base, stack_cli_env

pytestmark = pytest.mark.service


def crash_mlflow(stack: Stack) -> tuple[int, list[int]]:
    """SIGKILL to the MLflow server's recorded PID alone (a crash of the leader): its uvicorn workers stay."""
    record = read_record(stack.directory / "run" / "mlflow.pid")
    members = tagged_members(record.pid, record.tag)
    assert len(members) > 1, members   # the server and its workers
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [p for p in members if p != record.pid and pid_alive(p)]
    assert workers and port_taken("127.0.0.1", stack.settings.port("mlflow")), "the workers should outlive it"
    return record.pid, workers


def status_line(stack: Stack, name: str) -> str:
    result = stack.cli("status")
    return next(line for line in result.stdout.splitlines() if line.startswith(name))


def test_a_crashed_servers_workers_are_seen_by_status_and_ended_by_stop_and_by_start(stack: Stack):
    from pipeline.stack.__main__ import services

    port = stack.settings.port("mlflow")
    leader, workers = crash_mlflow(stack)
    line = status_line(stack, "mlflow")
    assert " LEFTOVER " in line and f"listening on {port}" in line, line
    assert all(str(p) in line for p in workers), line
    assert stack.cli("status").returncode == 1

    # `make stack-stop` does this for each service: the group's leftovers end, the port is free.
    (mlflow,) = [s for s in services(stack.settings) if s.name == "mlflow"]
    assert mlflow.stop()
    assert not any(pid_alive(p) for p in workers) and not port_taken("127.0.0.1", port)
    assert " down " in status_line(stack, "mlflow")

    started = stack.cli("start")
    assert started.returncode == 0, started.stdout + started.stderr
    _, workers = crash_mlflow(stack)
    again = stack.cli("start")   # after a crash: the leftovers end, the server starts again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "mlflow    ended the leftovers of a crashed start" in again.stdout, again.stdout
    assert not any(pid_alive(p) for p in workers)
    assert stack.cli("status").returncode == 0


def test_a_refused_start_writes_nothing_and_names_what_holds_the_port():
    base = free_port_base()
    held = base + PORT_OFFSETS["weed.filer.grpc"]   # an internal port weed would quietly move
    directory = Path(tempfile.mkdtemp(prefix="stack-test-refused-"))
    stack_dir = directory / "stack"
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", held))
        blocker.listen()
        result = subprocess.run([sys.executable, "-m", "pipeline.stack", "start", "--dir", str(stack_dir),
                                 "--port-base", str(base)], env=stack_cli_env(), capture_output=True, text=True,
                                cwd=tempfile.gettempdir(), timeout=120)
    assert result.returncode == 2
    assert f"{held} (weed.filer.grpc, held by pid {os.getpid()}" in result.stderr, result.stderr
    assert "nothing was started" in result.stderr and result.stderr.count("\n") == 1
    assert not stack_dir.exists(), sorted(str(p) for p in directory.rglob("*"))   # no secrets, settings, folder
    os.rmdir(directory)
