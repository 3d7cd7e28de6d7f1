"""``make push`` / ``make pull`` (``python -m pipeline.stack push|pull``) with wrong or missing S3 keys,
or with no store at the endpoint, against the real store: one line naming the remote and the
store's answer (403, or unreachable), exit 2, no traceback, nothing transferred."""

from __future__ import annotations

import subprocess

import boto3
import pytest

from ..pipeline.conftest import BIN
from .conftest import PYTHON, REPO, Stack, free_port_base

pytestmark = pytest.mark.service


def clone_with_remote(stack: Stack, root, endpoint: str | None = None) -> dict[str, str]:
    env = {**stack.client_env, "PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(root),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    if endpoint:
        env["TEAM_S3_ENDPOINT_URL"] = endpoint
    root.mkdir(parents=True)
    (root / "file.txt").write_text("x" * 1000)
    for argv in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], [str(BIN / "dvc"), "add", "-q", "file.txt"],
                 [PYTHON, "-m", "pipeline.stack", "remote"]):
        subprocess.run(argv, cwd=root, env=env, check=True, capture_output=True)
    return env


def transfer(root, env: dict[str, str], direction: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "pipeline.stack", direction], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_wrong_missing_keys_and_no_store_each_say_which(stack: Stack, tmp_path):
    env = clone_with_remote(stack, tmp_path / "repo")
    s3 = boto3.resource("s3", endpoint_url=env["TEAM_S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    before = sorted(o.key for o in s3.Bucket("dvc").objects.all())
    without_keys = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    cases = {"wrong": ({**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, "answered 403: it refuses the keys"),
             "missing": (without_keys, "answered 403 to a request without keys")}
    for case, (case_env, said) in cases.items():
        for direction in ("push", "pull"):
            result = transfer(tmp_path / "repo", case_env, direction)
            assert result.returncode == 2, (case, result.stdout + result.stderr)
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
            assert result.stderr.startswith(f"error: dvc {direction} with remote 'team' (s3://dvc/pipeline at "), \
                result.stderr
            assert said in result.stderr and "run it again once the remote answers" not in result.stderr, result.stderr
            assert env["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr
    assert sorted(o.key for o in s3.Bucket("dvc").objects.all()) == before   # nothing uploaded

    nowhere = f"http://127.0.0.1:{free_port_base() + 5}"
    away = clone_with_remote(stack, tmp_path / "away", endpoint=nowhere)
    for direction in ("push", "pull"):
        result = transfer(tmp_path / "away", away, direction)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stdout + result.stderr
        assert f"the S3 store at {nowhere} is unreachable" in result.stderr, result.stderr

    assert transfer(tmp_path / "repo", env, "push").returncode == 0   # the right keys: it goes through
