"""Two ``dvc repro`` at once on one checkout: the second refuses cleanly with DVC's lock while the
first finishes. The MLflow UI (``make ui``) and the Prefect server the flows start bind 127.0.0.1.

The first ``dvc repro`` is held inside its download stage by the data mirror, an HTTP server on
127.0.0.1 that answers the stage's first request only when the test lets it: the second repro
runs while the first certainly holds the repository lock, with no sleeps to tune.
"""

from __future__ import annotations

import functools
import http.server
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.pipeline.conftest import BIN, MIRROR, make_workspace, tiny_params

from .conftest import REPO

pytestmark = [pytest.mark.service, pytest.mark.pipeline]

LOOPBACK = {"127.0.0.1", "::1"}
needs_mirror = pytest.mark.skipif(not (MIRROR / "data/task1/raw/train.en.gz").is_file(),
                                  reason=f"the Multi30k mirror is not at {MIRROR}")


class GatedHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; every request waits until ``gate`` is set; ``arrived`` is set at the first."""

    arrived: threading.Event
    gate: threading.Event

    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass

    def do_GET(self):  # noqa: N802 - http.server's name
        self.arrived.set()
        self.gate.wait(timeout=300)
        super().do_GET()


@needs_mirror
def test_second_dvc_repro_refuses_with_the_lock_while_the_first_finishes(tmp_path):
    root, env = make_workspace(tmp_path / "repo", tiny_params())
    arrived, gate = threading.Event(), threading.Event()
    handler = type("Handler", (GatedHandler,), {"arrived": arrived, "gate": gate})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(MIRROR)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    env = {**env, "DATA_MIRROR": f"http://127.0.0.1:{server.server_address[1]}/", "NO_PROXY": "127.0.0.1",
           "no_proxy": "127.0.0.1"}
    dvc = [str(BIN / "dvc"), "repro", "download"]
    first = subprocess.Popen(dvc, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        assert arrived.wait(timeout=120), "the first repro's download stage never asked the mirror"
        assert (root / ".dvc" / "tmp" / "lock").exists()
        second = subprocess.run(dvc, cwd=root, env=env, capture_output=True, text=True, timeout=120)
        gate.set()
        out, _ = first.communicate(timeout=180)
    finally:
        gate.set()
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        server.shutdown()
        server.server_close()
        thread.join()

    # DVC holds its repository lock (.dvc/tmp/lock) while it plans and commits, and read/write locks
    # on the stage's paths (.dvc/tmp/rwlock) while the stage runs: the second repro meets one of them.
    refused = second.stdout + second.stderr
    assert second.returncode != 0
    assert "lock" in refused.lower(), refused
    assert ("Unable to acquire lock" in refused
            or ("is busy, it is being blocked by" in refused and f"(PID {first.pid})" in refused
                and ".dvc/tmp/rwlock" in refused)), refused
    assert "Running stage" not in refused and "Traceback" not in refused
    assert first.returncode == 0, out[-3000:]
    assert "Running stage 'download'" in out
    assert (root / "data" / "corpus" / "train.en").is_file() and (root / "dvc.lock").is_file()
    again = subprocess.run(dvc, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "Running stage" not in again.stdout, again.stdout + again.stderr


# ----------------------------------------------------------------------------- servers bind 127.0.0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(root_pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of a process and its descendants."""
    found = set()
    try:
        procs = [psutil.Process(root_pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def wait_listening(root_pid: int, port: int, proc: subprocess.Popen, timeout: float = 120) -> set[tuple[str, int]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        found = listening(root_pid)
        if any(p == port for _, p in found):
            time.sleep(1)                    # let every worker come up, then look again
            return listening(root_pid)
        time.sleep(0.3)
    raise AssertionError(f"nothing listens on port {port} after {timeout} s")


def outside_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (where a 0.0.0.0 bind would answer)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


def assert_loopback_only(found: set[tuple[str, int]], port: int) -> None:
    assert found, "no listening socket found"
    assert {ip for ip, _ in found} <= LOOPBACK, f"listening beyond loopback: {sorted(found)}"
    assert ("127.0.0.1", port) in found
    for address in outside_addresses():
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((address, port)) != 0, f"port {port} answers on {address}"


def stop_group(proc: subprocess.Popen) -> None:
    """End a server and its workers (its own process group): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # workers that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_make_ui_serves_mlflow_on_loopback_only(tmp_path):
    """The Makefile's ``ui`` command, as ``make -n ui`` prints it, run with another port and store."""
    dry = subprocess.run(["make", "-n", "ui"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    (line,) = [line for line in dry.stdout.splitlines() if " ui " in line and "mlflow" in line]
    args = shlex.split(line)
    assert args[0] == ".venv/bin/mlflow" and args[1] == "ui" and args[args.index("--host") + 1] == "127.0.0.1"
    assert "--port 5000" in line
    port = free_port()
    # As make runs it (sh -c), from tmp_path: the venv's mlflow by its full path, another port, a
    # tracking store in tmp_path through the MLFLOW_TRACKING_URI the command reads.
    command = f"exec {REPO}/{line.replace('--port 5000', f'--port {port}')}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.Popen(["sh", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert_loopback_only(wait_listening(proc.pid, port, proc), port)
    finally:
        stop_group(proc)


PREFECT_CHILD = """
import sys
from pathlib import Path
from pipeline.flows import serving
with serving.prefect_api(Path(sys.argv[1]), start_server=True) as url:
    print(url, flush=True)
    sys.stdin.readline()
print("stopped", flush=True)
"""


def test_prefect_server_started_by_the_flows_binds_loopback_only(tmp_path):
    """``serving.prefect_api(root, start_server=True)`` (what ``python -m pipeline.flows serve`` uses)
    with no PREFECT_API_URL: the local server it starts listens on 127.0.0.1 only."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_API_PORT=str(port),
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([sys.executable, "-c", PREFECT_CHILD, str(tmp_path)], cwd=tmp_path, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    servers: list[psutil.Process] = []
    try:
        said = [proc.stdout.readline()]         # "Prefect server on http://127.0.0.1:<port> ...", then the URL
        while said[-1] and not said[-1].startswith("http"):
            said.append(proc.stdout.readline())
        assert said[-1].strip() == f"http://127.0.0.1:{port}/api", \
            (said, proc.stderr.read()[-3000:] if not said[-1] else "")
        servers = psutil.Process(proc.pid).children(recursive=True)
        found = listening(proc.pid)
        assert_loopback_only(found, port)
        assert (tmp_path / ".prefect" / "prefect.db").exists()   # its database is the workspace's
        proc.stdin.close()                                       # prefect_api stops the server on exit
        assert proc.stdout.readline().strip() == "stopped"
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(servers, timeout=30)
        assert alive == [], f"left running: {alive}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for server in servers:                                   # the server runs in its own session
            try:
                server.kill()
            except psutil.NoSuchProcess:
                pass
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    assert proc.returncode == 0
