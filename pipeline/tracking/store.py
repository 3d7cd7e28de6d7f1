"""The tracking store: ``MLFLOW_TRACKING_URI`` when set (a team's server), else the embedded
store at the repository root (SQLite ``mlflow.db``, artifacts beside it in ``mlartifacts/``); the
client, experiments, and ``best_effort``: a tracking call that fails is a warning, never the end of
a stage's work."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
CHAMPION_ALIAS = "champion"


# A tracking server that went away must cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def _default_uri() -> str:
    return f"sqlite:///{Path(DEFAULT_DB).resolve()}"


def _user_uri() -> str:
    """The user's ``MLFLOW_TRACKING_URI``; ``mlflow.set_tracking_uri`` writes that variable
    too, so the embedded default found there does not count as the user's choice."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    return "" if uri == _default_uri() else uri


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the embedded SQLite store at the repository root."""
    return _user_uri() or _default_uri()


def safe_uri(uri: str) -> str:
    """``uri`` without a user or password in it (``https://user:secret@host`` -> ``https://host``):
    what may be printed or logged."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


def client() -> MlflowClient:
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(uri, uri)


def experiment_id(name: str, c: MlflowClient | None = None) -> str:
    """The experiment's id, created on first use (artifacts beside the embedded store)."""
    c = c or client()
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None if _user_uri() else Path(DEFAULT_ARTIFACTS).resolve().as_uri()
    return c.create_experiment(name, artifact_location=location)


def best_effort(action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a tracking call; a failure is a warning, never the end of the stage's work."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        print(f"warning: MLflow {action} failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr, flush=True)
        return None
