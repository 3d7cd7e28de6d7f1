"""pipeline/workers/results.py with real git repositories: a bare origin and a workspace clone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.workers.results import ResultsError, check_branch, publish

pytestmark = pytest.mark.fast

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), **IDENTITY}).stdout.strip()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, str]:
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "clone", "-q", str(origin), str(work))
    (work / "params.yaml").write_text("a: 1\n")
    (work / "code.py").write_text("x = 1\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "pinned")
    git(work, "push", "-q", "origin", "HEAD:main")
    for key in IDENTITY:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return origin, work, git(work, "rev-parse", "HEAD")


def test_results_go_on_top_of_the_pinned_commit_and_every_later_push_fast_forwards(workspace):
    origin, work, pinned = workspace
    (work / "dvc.lock").write_text("schema: '2.0'\nstages: {train: 1}\n")
    (work / "data" / "incoming").mkdir(parents=True)
    (work / "data" / "incoming" / "new.en.dvc").write_text("outs: []\n")
    (work / "data" / "incoming" / "new.en").write_text("not for git\n")   # DVC's data: never committed
    (work / "code.py").write_text("x = 2\n")                              # code edits: never committed
    first = publish(work, "retraining/results", "run 1")
    assert first.base == pinned and first.changed == ("data/incoming/new.en.dvc", "dvc.lock")
    assert git(origin, "rev-parse", "retraining/results") == first.commit
    assert git(origin, "log", "-1", "--format=%P", first.commit) == pinned
    assert "worker@" in git(origin, "log", "-1", "--format=%ae", first.commit)   # the host, when git has no identity
    assert git(origin, "show", f"{first.commit}:code.py") == "x = 1"

    (work / "dvc.lock").write_text("schema: '2.0'\nstages: {train: 2}\n")
    second = publish(work, "retraining/results", "run 2")
    assert git(origin, "log", "-1", "--format=%P", second.commit).split() == [pinned, first.commit]
    assert git(origin, "show", f"{second.commit}:dvc.lock").endswith("{train: 2}")

    unchanged = publish(work, "retraining/results", "run 3")
    assert unchanged.commit == "" and unchanged.changed == ()
    assert git(origin, "rev-parse", "retraining/results") == second.commit


@pytest.mark.parametrize("name", ["", "a..b", "/lead", "trail/", "x.lock", "sp ace", "a@{b"])
def test_a_bad_branch_name_is_one_error(name):
    with pytest.raises(ResultsError, match="not a valid git branch name"):
        check_branch(name)


def test_a_push_the_repository_refuses_is_one_error_naming_git_push(workspace):
    origin, work, _ = workspace
    hook = origin / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'results branches are closed' >&2\nexit 1\n")
    hook.chmod(0o755)
    (work / "dvc.lock").write_text("x\n")
    with pytest.raises(ResultsError, match="git push .*results branches are closed"):
        publish(work, "retraining/results", "run")
