"""The tracking store: ``MLFLOW_TRACKING_URI`` when set (a team's server), else the embedded
store at the repository root (SQLite ``mlflow.db``, artifacts beside it in ``mlartifacts/``); the
client and experiments. (A tracking call whose failure is a warning: ``failures.best_effort``.)"""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
CHAMPION_ALIAS = "champion"


# A tracking server that went away must cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
# Our commands print our own lines: no progress bars, run links or model URLs of MLflow's among them.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
os.environ.setdefault("MLFLOW_PRINT_MODEL_URLS_ON_CREATION", "false")


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
    try:
        return c.create_experiment(name, artifact_location=location)
    except MlflowException as err:
        # Two points of a sweep starting at once on two workers both find no experiment; the
        # second creation is refused, and the first one's experiment is the one to use.
        if err.error_code != "RESOURCE_ALREADY_EXISTS" or (found := c.get_experiment_by_name(name)) is None:
            raise
        return found.experiment_id
