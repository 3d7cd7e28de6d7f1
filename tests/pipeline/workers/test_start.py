"""``python -m pipeline.workers start`` (pipeline/workers/start.py): a worker started as a background
job of a non-interactive shell, where SIGINT is ignored, still stops on SIGINT; ``prefect worker
start`` started the same way does not. A real Prefect server (``prefect_test_harness``), real workers,
a real shell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.service

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def ignored_signals(pid: int) -> int:
    (line,) = [x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigIgn:")]
    return int(line.split()[1], 16)


def background_job(command: str, log: Path, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen, int]:
    """``command`` as a background job of a non-interactive bash (``command &``, as a script does),
    its output in ``log``; the shell and the job's PID."""
    shell = subprocess.Popen(["bash", "-c", f"{command} > {log} 2>&1 & echo $!; wait"], stdout=subprocess.PIPE,
                             text=True, env=env, cwd=cwd, start_new_session=True)
    return shell, int(shell.stdout.readline())


def wait_for(predicate, what: str, timeout: float = 90) -> None:   # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture(scope="module")
def prefect_api_url():
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def test_a_worker_started_in_the_background_stops_on_sigint(prefect_api_url, tmp_path):
    env = {**os.environ, "PREFECT_API_URL": prefect_api_url, "PYTHONPATH": str(REPO),
           "PREFECT_WORKER_QUERY_SECONDS": "1"}
    log = tmp_path / "worker.log"
    shell, pid = background_job(f"{sys.executable} -m pipeline.workers start --pool started --name w1 --type "
                                "process --limit 1", log, env, tmp_path)
    try:
        wait_for(lambda: "Worker 'w1' started" in log.read_text() if log.exists() else False,
                 f"the worker did not start: {log.read_text() if log.exists() else ''}")
        # Plain `prefect worker start` started so is still running a minute later (tried: the shell's
        # `wait` timed out); the worker's PID is the wrapper's (exec).
        os.kill(pid, signal.SIGINT)
        shell.wait(timeout=60)   # the job ended, so the shell's `wait` returned
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_shell_does_ignore_sigint_in_its_background_jobs(tmp_path):
    """The control: the same kind of job without the wrapper has SIGINT ignored (what made Prefect's
    worker unstoppable)."""
    shell, pid = background_job("sleep 30", tmp_path / "sleep.log", dict(os.environ), tmp_path)
    try:
        # The job's dispositions are set after the fork, a moment after its PID is printed.
        wait_for(lambda: ignored_signals(pid) & SIGINT_BIT, "SIGINT is not ignored in the shell's job", 10)
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def test_no_prefect_executable_is_one_error_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from pipeline.workers.__main__ import main

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))   # nothing beside it
    monkeypatch.setenv("PATH", str(tmp_path))                          # nor on PATH
    assert main(["start", "--pool", "p", "--limit", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: no prefect executable beside")


def test_a_worker_polls_the_default_queue_and_its_own_and_its_runs_learn_which(monkeypatch):
    from pipeline.workers.queues import WORKER_QUEUE_VAR, own_queue, worker_name
    from pipeline.workers.start import worker_command

    command = worker_command("gpu", "host-a", ["--limit", "1"])
    assert command[1:] == ["worker", "start", "--pool", "gpu", "--name", "host-a", "--work-queue", "default",
                           "--work-queue", "on-host-a", "--limit", "1"]
    # Queues of the user's own replace the default one; the worker's own is always polled; one run at a
    # time unless the user says otherwise (the runs share its workspace).
    assert worker_command("gpu", "host-a", ["-q", "urgent"])[7:] == ["--work-queue", "on-host-a", "--limit", "1",
                                                                      "-q", "urgent"]
    assert own_queue(worker_name(None)).startswith("on-") and worker_name("w") == "w"
    assert WORKER_QUEUE_VAR == "TEAM_WORKER_QUEUE"
