"""The Prefect server: its database in PostgreSQL (asyncpg; the password from PGPASSFILE), basic
auth on (``PREFECT_SERVER_API_AUTH_STRING``; clients send ``PREFECT_API_AUTH_STRING``), its home
(and UI settings) in ``<dir>/prefect``, analytics off."""

from __future__ import annotations

import base64
import os
import sys
import urllib.request

from pipeline.stack.postgres import Postgres
from pipeline.stack.processes import start_detached, wait_until
from pipeline.stack.secrets import PGPASS_FILE
from pipeline.stack.service import Health, Service

AUTH_USER = "admin"


class PrefectServer(Service):
    name = "prefect"
    port_names = ("prefect",)
    marker = "prefect"
    start_timeout_s = 120.0

    @property
    def auth_string(self) -> str:
        return f"{AUTH_USER}:{self.secrets.prefect_auth_password}"

    def env(self, postgres: Postgres) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "AWS_"))}
        env.update(
            PGPASSFILE=str(self.settings.path("secrets", PGPASS_FILE)),
            PREFECT_HOME=str(self.settings.path("prefect")),
            PREFECT_API_DATABASE_CONNECTION_URL=postgres.url("prefect", "prefect", "postgresql+asyncpg"),
            PREFECT_SERVER_API_AUTH_STRING=self.auth_string,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_SERVER_API_HOST=self.settings.host, PREFECT_SERVER_API_PORT=str(self.settings.port("prefect")),
            PREFECT_UI_API_URL=f"{self.settings.url('prefect')}/api")
        return env

    def argv(self) -> list[str]:
        return [os.path.join(os.path.dirname(sys.executable), "prefect"), "server", "start",
                "--host", self.settings.host, "--port", str(self.settings.port("prefect"))]

    def start(self) -> int:
        postgres = Postgres(self.settings, self.secrets)
        pid = start_detached(self.argv(), self.env(postgres), self.log_file, self.pid_file,
                             self.settings.path("prefect"))
        wait_until(lambda: self.health().ok, "the Prefect server", self.start_timeout_s, self.log_file, pid)
        return pid

    def health(self) -> Health:
        """``/api/health`` and an authenticated read (the work pools): the server and its database."""
        token = base64.b64encode(self.auth_string.encode()).decode()
        request = urllib.request.Request(f"{self.settings.url('prefect')}/api/work_pools/filter", data=b"{}",
                                         method="POST", headers={"Authorization": f"Basic {token}",
                                                                 "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return Health(response.status == 200, f"HTTP {response.status}")
        except Exception as err:   # noqa: BLE001
            return Health(False, f"{type(err).__name__}: {str(err)[:200]}")
