"""pipeline/workers/workspace.py: the deployment's pull steps, run by Prefect's own step runner
against a real git repository, as a worker's flow run runs them."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from prefect.deployments.steps.core import run_steps
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

from pipeline.workers.workspace import WorkspaceError, pull_steps

pytestmark = pytest.mark.fast


def git(cwd: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture(autouse=True)
def patient_ephemeral_server():
    """Prefect's step runner asks the API (for blocks and variables) even here, and without an API URL it
    starts its own server in the background: 5 to 10 s on an idle 2-core machine, but past Prefect's
    20 s limit on a loaded one (a training beside the tests), where the step failed with "Timed out
    while attempting to connect to ephemeral Prefect API server". So the limit is raised here."""
    with temporary_settings({PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 120}):
        yield


@pytest.fixture
def repository(tmp_path: Path) -> tuple[Path, list[str]]:
    source = tmp_path / "source"
    source.mkdir()
    git(source, "init", "-q", "-b", "main")
    commits = []
    for version in (1, 2):
        (source / "code.py").write_text(f"version = {version}\n")
        git(source, "add", "-A")
        git(source, "commit", "-qm", f"version {version}")
        commits.append(git(source, "rev-parse", "HEAD"))
    return source, commits


@pytest.mark.slow
def test_the_steps_clone_once_then_check_out_each_pinned_commit_keeping_the_outputs(repository, tmp_path, monkeypatch):
    source, (first, second) = repository
    workspace = tmp_path / "workspace"
    monkeypatch.setenv("TEAM_WORKSPACE", str(workspace))
    monkeypatch.chdir(tmp_path)
    outputs = asyncio.run(run_steps(pull_steps(str(source), first)))
    assert Path.cwd() == workspace and outputs["directory"] == str(workspace)
    assert git(workspace, "rev-parse", "HEAD") == first and (workspace / "code.py").read_text() == "version = 1\n"

    (workspace / "models").mkdir()
    (workspace / "models" / "checkpoint_00000010.pt").write_bytes(b"weights")   # what a killed run left
    (workspace / "code.py").write_text("edited by hand\n")
    monkeypatch.chdir(tmp_path)
    asyncio.run(run_steps(pull_steps(str(source), second)))
    assert git(workspace, "rev-parse", "HEAD") == second and (workspace / "code.py").read_text() == "version = 2\n"
    assert (workspace / "models" / "checkpoint_00000010.pt").read_bytes() == b"weights"


def test_without_a_workspace_folder_the_step_fails_saying_which_variable(repository, tmp_path, monkeypatch):
    source, (first, _) = repository
    monkeypatch.delenv("TEAM_WORKSPACE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="run_shell_script") as failed:
        asyncio.run(run_steps(pull_steps(str(source), first)))
    assert "set TEAM_WORKSPACE in the worker's environment" in str(failed.value.__cause__)


def test_a_deployment_pins_a_full_sha():
    with pytest.raises(WorkspaceError, match="full 40-character sha"):
        pull_steps("git://example.org/x.git", "main")
    with pytest.raises(WorkspaceError, match="repository"):
        pull_steps("", "a" * 40)
