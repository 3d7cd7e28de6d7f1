"""tests/conftest.py's interrupts: a test run killed by SIGTERM to its process group (a CI job's
timeout, ``kill -- -PGID``) still runs its fixtures' teardown, so a server that a session fixture
started does not outlive the run; with two pytest-xdist workers and without xdist. Run as pytest
itself runs, in a subprocess, with a ``sleep`` standing for the server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.stack.processes import pid_alive

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFTEST = "from tests.conftest import pytest_configure  # noqa: F401\n"
MODULE = '''import os
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def server():
    process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path(f"server.{os.getpid()}").write_text(str(process.pid))
    yield
    process.terminate()
    process.wait()


def test_waits(server):
    time.sleep(300)
'''


def started_servers(folder: Path, count: int, run: subprocess.Popen) -> list[int]:
    """The PIDs the session fixtures recorded, once ``count`` of them have (within a minute)."""
    deadline = time.monotonic() + 60
    while len(files := sorted(folder.glob("server.*"))) < count or any(not f.read_text() for f in files):
        assert run.poll() is None, run.communicate()[0]
        assert time.monotonic() < deadline, f"{len(files)} of {count} servers started in 60 s"
        time.sleep(0.2)
    return [int(f.read_text()) for f in files]


@pytest.mark.parametrize("xdist", [("-n", "2", "--dist", "loadfile"), ("-p", "no:xdist")], ids=["xdist", "plain"])
def test_sigterm_to_the_run_stops_what_its_fixtures_started(tmp_path, xdist):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for name in ("test_a.py", "test_b.py"):      # loadfile: one module a worker
        (tmp_path / name).write_text(MODULE)
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    servers: list[int] = []
    try:
        servers = started_servers(tmp_path, 2 if "-n" in xdist else 1, run)
        assert all(pid_alive(pid, "sleep 600") for pid in servers)
        os.killpg(run.pid, signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
        assert run.returncode != 0, output     # an xdist controller ends by the signal itself (-15)
        assert [pid for pid in servers if pid_alive(pid, "sleep 600")] == []
    finally:
        for pid in servers:              # only on failure: what the run left behind
            if pid_alive(pid, "sleep 600"):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
