"""The commands that hand work to the team's Prefect server, with wrong, missing or unanswered
credentials against the stack's real servers: ``python -m pipeline.flows run`` (which asks the
MLflow server first, then the Prefect server, before any stage runs) and ``python -m pipeline.workers
deploy``. Each is one line naming the server and its answer (401, or no answer), exit 2, no
traceback and no secret printed."""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import PYTHON, REPO, Stack
from .test_deploy_checks import git, repo  # noqa: F401 (a fixture)
from .test_tracking_faults import free_port, one_error_line

pytestmark = pytest.mark.service


def client_env(stack: Stack, home) -> dict[str, str]:
    """What ``source .stack/env`` gives a shell that had none of the services' variables, in a home
    of its own (Prefect writes its profile there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "AWS_", "STACK_"))}
    return {**env, **stack.client_env, "PYTHONPATH": str(REPO), "HOME": str(home),
            "PREFECT_HOME": str(home / "prefect")}


def cases(env: dict[str, str]) -> dict[str, tuple[dict[str, str], str, tuple[str, ...]]]:
    """Each case's environment, the server its one line names, and words the line holds."""
    no_auth = {k: v for k, v in env.items() if k != "PREFECT_API_AUTH_STRING"}
    return {
        "prefect refuses": ({**env, "PREFECT_API_AUTH_STRING": "admin:wrong"}, "Prefect",
                            ("answered 401", "in PREFECT_API_AUTH_STRING were refused", "source .stack/env")),
        "prefect without credentials": (no_auth, "Prefect", ("answered 401", "are missing")),
        "prefect away": ({**env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}, "Prefect",
                         ("does not answer",)),
    }


def assert_secretless(result: subprocess.CompletedProcess, env: dict[str, str]) -> None:
    for name in ("PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_PASSWORD"):
        secret = env[name].split(":")[-1]
        assert secret not in result.stdout + result.stderr, name


def test_flows_name_the_server_that_refused_or_is_away(stack: Stack, tmp_path):
    env = client_env(stack, tmp_path)
    runs = {"mlflow refuses": ({**env, "MLFLOW_TRACKING_PASSWORD": "wrong"}, "MLflow",
                               ("answered 401", "MLFLOW_TRACKING_PASSWORD")), **cases(env)}
    for case, (case_env, service, words) in runs.items():
        result = subprocess.run([PYTHON, "-m", "pipeline.flows", "run"], cwd=REPO, env=case_env, capture_output=True,
                                text=True, timeout=180)
        one_error_line(result, *words, service=service)
        assert "Prefect API:" not in result.stdout, (case, result.stdout)   # stopped before any flow ran
        assert_secretless(result, env)


def test_deploy_names_the_server_that_refused_or_is_away(stack: Stack, repo, tmp_path):  # noqa: F811
    env = client_env(stack, tmp_path)
    for case, (case_env, service, words) in cases(env).items():
        result = subprocess.run([PYTHON, "-m", "pipeline.workers", "deploy", "--repository",
                                 str(tmp_path / "served.git"), "--pool", "gpu", "--params", str(REPO / "params.yaml")],
                                cwd=repo, env=case_env, capture_output=True, text=True, timeout=180)
        one_error_line(result, *words, service=service)
        assert "deployment" not in result.stdout, (case, result.stdout)
        assert_secretless(result, env)
    unset = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    result = subprocess.run([PYTHON, "-m", "pipeline.workers", "deploy", "--repository", str(tmp_path / "served.git"),
                             "--pool", "gpu", "--params", str(REPO / "params.yaml")], cwd=repo, env=unset,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2 and result.stderr.startswith("error: PREFECT_API_URL is not set"), result.stderr
    assert git(repo, "status", "--porcelain") == ""
