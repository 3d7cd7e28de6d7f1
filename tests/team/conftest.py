"""The team's services for real: ``python -m pipeline.stack start`` (PostgreSQL from the OS, the
SeaweedFS S3 store, the MLflow and Prefect servers) in a folder of its own on free ports, once for
the session, stopped by its own command at the end. Skipped where PostgreSQL or requirements-stack.txt
(``stack_packages.py``) is not installed, except where ``STACK_TESTS_REQUIRED=1`` (CI, which installs
them): there, their absence fails. Every test here is marked ``service`` (tests/conftest.py)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.stack import client_env
from pipeline.stack.processes import StackError, port_taken
from pipeline.stack.secrets import load_or_create
from pipeline.stack.settings import PORT_OFFSETS, StackSettings

from . import stack_packages
from .stack_packages import pytest_pycollect_makemodule  # noqa: F401  (the hook: skip, not fail, without boto3)

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def server_client(uri: str) -> MlflowClient:
    """A client of the server for tracking and registry alike (an earlier test in the same process
    may have set MLflow's global registry URI to another store)."""
    return MlflowClient(uri, uri)


def postgres_missing() -> str:
    from pipeline.stack.postgres import bin_dir
    try:
        bin_dir()
    except StackError as err:
        return str(err)
    return ""


def free_port_base(host: str = "127.0.0.1") -> int:
    """A base whose every stack port is free (the stack refuses a taken one; this picks around them)."""
    for _ in range(200):
        base = random.randrange(20000, 45000, 20)
        if not any(port_taken(host, base + offset) for offset in PORT_OFFSETS.values()):
            return base
    raise RuntimeError("no free port range for the stack")


@dataclass
class Stack:
    directory: Path
    port_base: int
    host: str = "127.0.0.1"

    @property
    def settings(self) -> StackSettings:
        return StackSettings(directory=self.directory, host=self.host, port_base=self.port_base)

    @property
    def client_env(self) -> dict[str, str]:
        """What ``source <dir>/env`` sets."""
        return client_env.client_variables(self.settings, load_or_create(self.directory / "secrets"))

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: int = 240,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``python -m pipeline.stack ARGS --dir <this stack>``, run from ``cwd``: by default a
        folder without ``.dvc``, since ``start`` points the DVC clone it runs in at this stack's
        remote (``.dvc/config.local``), and the checkout under test must keep its own."""
        return subprocess.run([PYTHON, "-m", "pipeline.stack", *args, "--dir", str(self.directory)],
                              cwd=cwd or tempfile.gettempdir(), env=env or stack_cli_env(), capture_output=True,
                              text=True, timeout=timeout)


def stack_cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STACK_", "MLFLOW_", "PREFECT_", "AWS_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def start_stack(directory: Path, port_base: int, host: str = "127.0.0.1") -> Stack:
    stack = Stack(directory, port_base, host)
    result = subprocess.run([PYTHON, "-m", "pipeline.stack", "start", "--dir", str(directory), "--host", host,
                             "--port-base", str(port_base)], cwd=tempfile.gettempdir(), env=stack_cli_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return stack


def skip_without_second_hosts() -> None:
    """Skip (with the reason) where network namespaces cannot be made or the Multi30k mirror is missing."""
    from ..pipeline.conftest import MIRROR
    from .hosts import unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("STACK_TESTS_REQUIRED") == "1":
            pytest.fail(f"STACK_TESTS_REQUIRED=1 but {reason}")
        pytest.skip(reason)
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")


@pytest.fixture(scope="session", autouse=True)
def checkout_keeps_its_dvc_remote() -> Iterator[None]:
    """No team test may point the checkout under test at a test stack's remote (a developer's
    ``make push`` after ``make test`` would go to a stack that is gone)."""
    local = REPO / ".dvc" / "config.local"
    before = local.read_bytes() if local.exists() else None
    yield
    after = local.read_bytes() if local.exists() else None
    assert after == before, f"the team tests changed {local}: {before!r} -> {after!r}"


@contextmanager
def running_stack(host: str = "127.0.0.1") -> Iterator[Stack]:
    """A stack of its own binding ``host``, stopped by its own command at the end."""
    stack_packages.require()   # requirements-stack.txt: skipped without it, failed under STACK_TESTS_REQUIRED=1
    missing = postgres_missing()
    if missing:
        if os.environ.get("STACK_TESTS_REQUIRED") == "1":
            pytest.fail(f"STACK_TESTS_REQUIRED=1 but {missing}")
        pytest.skip(missing)
    # Not under pytest's 0700 temporary root: PostgreSQL runs as its own user and must enter it.
    directory = Path(tempfile.mkdtemp(prefix="stack-test-"))
    os.chmod(directory, 0o755)
    started = None
    try:
        started = start_stack(directory / "stack", free_port_base(host), host)
        yield started
    finally:
        if started is not None:
            stopped = started.cli("stop")
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    with running_stack() as started:
        yield started
