"""The MLflow tracking server: runs and the model registry in PostgreSQL, artifacts proxied to the
object store's ``mlflow`` bucket (clients need only ``MLFLOW_TRACKING_URI`` and their MLflow
credentials, no S3 keys), basic auth on (users in the ``mlflow_auth`` database; the ``admin``
user's password generated), background job processes off (they hold 2.3 GiB for features the
pipeline does not use)."""

from __future__ import annotations

import base64
import os
import sys
import urllib.request

from pipeline.stack.postgres import Postgres
from pipeline.stack.processes import start_detached, wait_until
from pipeline.stack.secrets import PGPASS_FILE, write_private
from pipeline.stack.service import Health, Service

ADMIN_USER = "admin"
WORKERS = 2
AUTH_CACHE_TTL_S = 60   # MLflow's basic-auth credential cache (see _auth_config)


class MlflowServer(Service):
    name = "mlflow"
    port_names = ("mlflow",)
    marker = "mlflow"
    start_timeout_s = 120.0   # the first start migrates an empty database

    def allowed_hosts(self) -> str:
        port = self.settings.port("mlflow")
        names = [self.settings.host, "localhost", "127.0.0.1", *self.settings.allowed_hosts]
        return ",".join(dict.fromkeys(h for name in names for h in (name, f"{name}:{port}")))

    def _auth_config(self, postgres: Postgres) -> str:
        """MLflow's basic-auth configuration. Its credential cache is on: without it every request
        pays a scrypt hash check (76 ms of a core, measured), and a stage sends a hundred or more
        (logging a model alone reads each metric's history); a changed password or a deleted user
        is seen at once by the worker that made the change, by the others within the TTL."""
        path = self.settings.path("secrets", "basic_auth.ini")
        write_private(path, "[mlflow]\ndefault_permission = READ\n"
                            f"database_uri = {postgres.url('mlflow_auth', 'mlflow')}\n"
                            f"admin_username = {ADMIN_USER}\n"
                            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
                            f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n")
        return str(path)

    def env(self, postgres: Postgres) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_"))}
        env.update(
            PGPASSFILE=str(self.settings.path("secrets", PGPASS_FILE)),
            MLFLOW_AUTH_CONFIG_PATH=self._auth_config(postgres),
            MLFLOW_AUTH_ADMIN_PASSWORD=self.secrets.mlflow_admin_password,   # used on the first start only
            MLFLOW_FLASK_SERVER_SECRET_KEY=self.secrets.mlflow_flask_secret,
            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
            AWS_ACCESS_KEY_ID=self.secrets.s3_access_key, AWS_SECRET_ACCESS_KEY=self.secrets.s3_secret_key,
            AWS_DEFAULT_REGION="us-east-1", MLFLOW_S3_ENDPOINT_URL=self.settings.url("s3"))
        return env

    def argv(self, postgres: Postgres) -> list[str]:
        return [str(os.path.join(os.path.dirname(sys.executable), "mlflow")), "server",
                "--backend-store-uri", postgres.url("mlflow", "mlflow"),
                "--artifacts-destination", "s3://mlflow/artifacts", "--serve-artifacts",
                "--host", self.settings.host, "--port", str(self.settings.port("mlflow")),
                "--workers", str(WORKERS), "--app-name", "basic-auth", "--allowed-hosts", self.allowed_hosts()]

    def start(self) -> int:
        postgres = Postgres(self.settings, self.secrets)
        pid = start_detached(self.argv(postgres), self.env(postgres), self.log_file, self.pid_file,
                             self.settings.path("mlflow"))
        wait_until(lambda: self.health().ok, "the MLflow server", self.start_timeout_s, self.log_file, pid)
        return pid

    def health(self) -> Health:
        """An authenticated API call: the server answers, reaches PostgreSQL and accepts the admin."""
        token = base64.b64encode(f"{ADMIN_USER}:{self.secrets.mlflow_admin_password}".encode()).decode()
        request = urllib.request.Request(f"{self.settings.url('mlflow')}/api/2.0/mlflow/experiments/search"
                                         "?max_results=1", headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return Health(response.status == 200, f"HTTP {response.status}")
        except Exception as err:   # noqa: BLE001 - any failure is "not healthy", said as is
            return Health(False, f"{type(err).__name__}: {str(err)[:200]}")
