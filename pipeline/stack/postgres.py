"""PostgreSQL from the operating system's packages (Debian: ``apt-get install postgresql``): a
cluster of the stack's own in ``<dir>/postgres``, on the stack's port, bound to its address, run
as the ``postgres`` user when started by root. Local connections (its Unix socket in the stack's
folder) authenticate by the OS user; TCP ones by password (scram-sha-256), and only from the
stack's own machine: on another bind address (a bridge that other hosts reach) pg_hba.conf admits
that address alone, where the MLflow and Prefect servers connect from, so the database stays
closed to the other hosts even though they reach its port. Two databases with a role each:
``mlflow`` (plus ``mlflow_auth``, the MLflow server's users) and ``prefect``."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
from pathlib import Path

from pipeline.stack.groups import TAG_VARIABLE, new_tag, write_record
from pipeline.stack.processes import StackError, read_pid, run_checked, wait_until
from pipeline.stack.service import Health, Service
from transformer.atomic import write_text

APT_HINT = "apt-get update && apt-get install -y postgresql"
DATABASES = {"mlflow": "mlflow", "mlflow_auth": "mlflow", "prefect": "prefect"}   # database: owner


def bin_dir() -> Path:
    """The newest installed PostgreSQL's programs (Debian keeps them off PATH)."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise StackError(f"PostgreSQL is not installed (no initdb); install it with: {APT_HINT}")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Postgres(Service):
    name = "postgres"
    port_names = ("postgres",)
    marker = "postgres"
    stop_signal = signal.SIGINT    # PostgreSQL's "fast" shutdown: ends sessions, then stops cleanly
    stop_group = False             # pg_ctl's child; the postmaster waits for its own children

    @property
    def data_dir(self) -> Path:
        return self.settings.path("postgres", "data")

    @property
    def socket_dir(self) -> Path:
        return self.settings.path("postgres", "socket")

    def _as_owner(self, argv: list[str]) -> list[str]:
        """Root may not run PostgreSQL: its commands run as the ``postgres`` user."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def _own(self, *paths: Path) -> None:
        if os.geteuid() == 0:
            for path in paths:
                shutil.chown(path, "postgres", "postgres")

    def _check_reachable(self) -> None:
        if os.geteuid() != 0:
            return
        probe = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-x", str(self.settings.path())])
        if probe.returncode != 0:
            raise StackError(f"the postgres user cannot enter {self.settings.path()}: put the stack's "
                             f"folder where every user can pass (STACK_DIR), e.g. not under /root")

    def _initdb(self, bins: Path) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        self._own(self.data_dir.parent, self.data_dir)
        run_checked(self._as_owner([str(bins / "initdb"), "-D", str(self.data_dir), "--auth-local=peer",
                                    "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-instructions"]),
                    "initdb")

    def _admit_bind_address(self) -> None:
        """initdb admits TCP clients from loopback only; the servers connect from the bind address."""
        address = ipaddress.ip_address(self.settings.host)
        if address.is_loopback:
            return
        hba = self.data_dir / "pg_hba.conf"
        line = f"host all all {address}/{address.max_prefixlen} scram-sha-256"
        text = hba.read_text()
        if line not in text.splitlines():
            write_text(hba, text.rstrip("\n") + f"\n# the stack's own servers, on its bind address\n{line}\n")
            os.chmod(hba, 0o600)
            self._own(hba)

    def start(self) -> int:
        bins = bin_dir()
        self._check_reachable()
        self.settings.path("postgres").mkdir(parents=True, exist_ok=True)
        os.chmod(self.settings.path("postgres"), 0o755)
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb(bins)
        self._admit_bind_address()
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.touch()
        self._own(self.socket_dir, self.log_file)
        options = (f"-p {self.settings.port('postgres')} -k {self.socket_dir} "
                   f"-c listen_addresses={self.settings.host}")
        # pg_ctl makes the postmaster a session and group leader (setsid); the tag reaches it and
        # its backends through the environment, like every other service's (``groups``).
        tag = new_tag()
        run_checked(self._as_owner([str(bins / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                                    "-o", options, "-w", "-t", "60", "start"]), "pg_ctl start",
                    env={**os.environ, TAG_VARIABLE: tag})
        pid = read_pid(self.data_dir / "postmaster.pid")
        if pid is None:
            raise StackError(f"PostgreSQL started but wrote no postmaster.pid in {self.data_dir}")
        write_record(self.pid_file, pid, tag)
        wait_until(lambda: self.health().ok, "PostgreSQL", self.start_timeout_s, self.log_file, pid)
        self._create_databases(bins)
        return pid

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL as the cluster's superuser over the Unix socket; SQL goes by stdin (passwords in it
        never reach a command line)."""
        return run_checked(self._as_owner([str(bin_dir() / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1",
                                           "-h", str(self.socket_dir), "-p", str(self.settings.port("postgres")),
                                           "-d", database, "-f", "-"]), "psql", input_text=sql)

    def _create_databases(self, bins: Path) -> None:
        passwords = {"mlflow": self.secrets.mlflow_db_password, "prefect": self.secrets.prefect_db_password}
        sql = []
        for role, password in passwords.items():
            sql.append(f"SELECT 'CREATE ROLE {role} LOGIN' WHERE NOT EXISTS "
                       f"(SELECT 1 FROM pg_roles WHERE rolname = '{role}')\\gexec")
            sql.append(f"ALTER ROLE {role} PASSWORD {_quote(password)};")
        for database, owner in DATABASES.items():
            sql.append(f"SELECT 'CREATE DATABASE {database} OWNER {owner}' WHERE NOT EXISTS "
                       f"(SELECT 1 FROM pg_database WHERE datname = '{database}')\\gexec")
        self.psql("\n".join(sql) + "\n")

    def health(self) -> Health:
        proc = subprocess.run([str(bin_dir() / "pg_isready"), "-h", self.settings.host,
                               "-p", str(self.settings.port("postgres")), "-t", "3"],
                              capture_output=True, text=True)
        return Health(proc.returncode == 0, proc.stdout.strip() or proc.stderr.strip())

    def url(self, database: str, role: str, driver: str = "postgresql") -> str:
        """A URL without password (it comes from PGPASSFILE)."""
        return f"{driver}://{role}@{self.settings.host}:{self.settings.port('postgres')}/{database}"
