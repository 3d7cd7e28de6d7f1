"""The stack's passwords and keys: generated at the first start, kept in ``<dir>/secrets/`` (a
0700 folder, each file 0600, git-ignored with the whole stack folder), handed to the services
through their environment or a password file, never on a command line that ``ps`` shows."""

from __future__ import annotations

import json
import os
import secrets as random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from transformer.atomic import atomic_write

SECRETS_FILE = "secrets.json"
PGPASS_FILE = "pgpass"


@dataclass(frozen=True)
class StackSecrets:
    mlflow_db_password: str
    prefect_db_password: str
    mlflow_admin_password: str       # the MLflow server's ``admin`` user (basic auth)
    mlflow_flask_secret: str         # MLFLOW_FLASK_SERVER_SECRET_KEY: signs the auth app's sessions
    prefect_auth_password: str       # PREFECT_SERVER_API_AUTH_STRING is ``admin:<this>``
    s3_access_key: str
    s3_secret_key: str
    # SeaweedFS's JWT signing keys (its security.toml ``[jwt.signing]`` and ``[jwt.filer_signing]``,
    # each with a read key): the volume server takes writes and reads only with a token the master
    # (or the filer, for the S3 gateway) signed; the filer's HTTP API likewise.
    weed_volume_write_key: str
    weed_volume_read_key: str
    weed_filer_write_key: str
    weed_filer_read_key: str

    @classmethod
    def generate(cls) -> StackSecrets:
        return cls(
            mlflow_db_password=random.token_urlsafe(24), prefect_db_password=random.token_urlsafe(24),
            mlflow_admin_password=random.token_urlsafe(24), mlflow_flask_secret=random.token_hex(32),
            prefect_auth_password=random.token_urlsafe(24),
            s3_access_key="team" + random.token_hex(8), s3_secret_key=random.token_urlsafe(30),
            weed_volume_write_key=random.token_hex(32), weed_volume_read_key=random.token_hex(32),
            weed_filer_write_key=random.token_hex(32), weed_filer_read_key=random.token_hex(32))


def write_private(path: Path, text: str) -> None:
    """Write ``text`` atomically with mode 0600 (the folder 0700): readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)

    def write(f) -> None:   # noqa: ANN001 - a binary file object
        os.fchmod(f.fileno(), 0o600)
        f.write(text.encode())
    atomic_write(path, write)
    os.chmod(path, 0o600)


def read(directory: Path) -> tuple[StackSecrets, bool]:
    """The secrets kept in ``directory`` and whether the file holds them all, writing nothing: the
    first start's secrets are generated here, and so are those a stack of an older version lacks
    (its other secrets kept); ``save`` writes them once the start is sure to go ahead."""
    path = directory / SECRETS_FILE
    kept = json.loads(path.read_text()) if path.is_file() else {}
    fresh = asdict(StackSecrets.generate())
    names = [f.name for f in fields(StackSecrets)]
    return StackSecrets(**{name: kept.get(name, fresh[name]) for name in names}), all(n in kept for n in names)


def save(directory: Path, secrets: StackSecrets) -> None:
    write_private(directory / SECRETS_FILE, json.dumps(asdict(secrets), indent=2) + "\n")


def load_or_create(directory: Path) -> StackSecrets:
    """The secrets kept in ``directory``, generated (and written) on the first call."""
    secrets, complete = read(directory)
    if not complete:
        save(directory, secrets)
    return secrets


def write_pgpass(directory: Path, host: str, port: int, secrets: StackSecrets) -> Path:
    """libpq's password file (``PGPASSFILE``), read by psycopg2 (MLflow) and asyncpg (Prefect): the
    database URLs the servers get carry no password."""
    lines = [f"{h}:{port}:*:mlflow:{secrets.mlflow_db_password}" for h in (host, "localhost")]
    lines += [f"{h}:{port}:*:prefect:{secrets.prefect_db_password}" for h in (host, "localhost")]
    path = directory / PGPASS_FILE
    write_private(path, "\n".join(lines) + "\n")
    return path
