"""What clients need to use the stack: the env file (``<dir>/env``, mode 0600: it holds
credentials) that a user sources on any machine (the DVC remote it names: ``remote``)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from pipeline.stack.mlflow_service import ADMIN_USER
from pipeline.stack.prefect_service import AUTH_USER
from pipeline.stack.secrets import StackSecrets, write_private
from pipeline.stack.settings import StackSettings

ENV_FILE = "env"
REMOTE_URL_VAR, ENDPOINT_VAR = "TEAM_DVC_REMOTE_URL", "TEAM_S3_ENDPOINT_URL"
# Model artifacts go through the MLflow server's proxy: MLflow's 10 s default (and the pipeline's
# own) is too short for a model upload on a busy server.
ARTIFACT_TIMEOUT_S = 300


def client_variables(settings: StackSettings, secrets: StackSecrets) -> dict[str, str]:
    return {
        "MLFLOW_TRACKING_URI": settings.url("mlflow"),
        "MLFLOW_TRACKING_USERNAME": ADMIN_USER,
        "MLFLOW_TRACKING_PASSWORD": secrets.mlflow_admin_password,
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(ARTIFACT_TIMEOUT_S),
        "PREFECT_API_URL": f"{settings.url('prefect')}/api",
        "PREFECT_API_AUTH_STRING": f"{AUTH_USER}:{secrets.prefect_auth_password}",
        "AWS_ACCESS_KEY_ID": secrets.s3_access_key,
        "AWS_SECRET_ACCESS_KEY": secrets.s3_secret_key,
        # botocore's "standard" retries: a bounded retry budget per client, so a store that went away
        # fails a push of thousands of files in seconds instead of retrying each one for minutes.
        "AWS_RETRY_MODE": "standard",
        REMOTE_URL_VAR: "s3://dvc/pipeline",
        ENDPOINT_VAR: settings.url("s3"),
    }


def write_env_file(settings: StackSettings, secrets: StackSecrets) -> Path:
    lines = ["# The team's services, written by `make stack` (mode 0600: it holds credentials; never commit it).",
             "# On any machine: `source <this file>`; once per clone `make stack-remote` (DVC's remote);",
             "# then `make run`, `make push`, `make pull`, `make compare`, `make serve-model` use the services.",
             *(f"export {key}={shlex.quote(value)}" for key, value in client_variables(settings, secrets).items())]
    path = settings.path(ENV_FILE)
    write_private(path, "\n".join(lines) + "\n")
    os.chmod(path.parent, 0o755)   # the stack's folder stays passable (PostgreSQL's user); secrets/ is 0700
    return path
