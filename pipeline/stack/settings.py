"""Where the stack keeps its data and which address and ports it serves on.

Chosen at the first start (options or ``STACK_*`` environment variables), then kept in
``<dir>/settings.json``: a restart serves the data it left on the same ports. Every port is
named here, the object store's internal ones included: left to itself, ``weed`` moves a port it
finds taken (and one whose gRPC twin, port + 10000, would pass 65535) without failing.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformer.atomic import write_json

DEFAULT_DIR = Path(".stack")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT_BASE = 54300
SETTINGS_FILE = "settings.json"

# Offsets from the port base. The first four are what clients use; the rest are the object
# store's own (its master, volume and filer servers and their gRPC twins, its S3 gateway's gRPC).
PORT_OFFSETS = {
    "postgres": 0, "s3": 1, "mlflow": 2, "prefect": 3,
    "weed.master": 10, "weed.master.grpc": 11, "weed.volume": 12, "weed.volume.grpc": 13,
    "weed.filer": 14, "weed.filer.grpc": 15, "weed.s3.grpc": 16,
}


class SettingsError(ValueError):
    """A bad stack setting: one message naming it."""


@dataclass(frozen=True)
class StackSettings:
    """``host``: the address every service binds (127.0.0.1, or a bridge's address for other hosts);
    ``allowed_hosts``: extra host names clients may use for MLflow (its ``--allowed-hosts``)."""

    directory: Path = DEFAULT_DIR
    host: str = DEFAULT_HOST
    port_base: int = DEFAULT_PORT_BASE
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise SettingsError(f"stack host: {self.host!r} is not an IP address to bind") from None
        top = self.port_base + max(PORT_OFFSETS.values())
        if not 1024 <= self.port_base or top > 65535:
            raise SettingsError(f"stack port base: {self.port_base} leaves ports outside 1024-65535 "
                                f"(the stack uses base to base+{max(PORT_OFFSETS.values())})")

    def port(self, name: str) -> int:
        return self.port_base + PORT_OFFSETS[name]

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.port(name)}"

    @property
    def ports(self) -> dict[str, int]:
        return {name: self.port(name) for name in PORT_OFFSETS}

    def path(self, *parts: str) -> Path:
        return self.directory.resolve().joinpath(*parts)

    def save(self) -> None:
        data = asdict(self)
        data["directory"] = str(self.directory)
        data["allowed_hosts"] = list(self.allowed_hosts)
        write_json(self.path(SETTINGS_FILE), data)


def load(directory: Path | None = None, host: str | None = None, port_base: int | None = None,
         allowed_hosts: tuple[str, ...] | None = None) -> StackSettings:
    """The stack's settings: given values, else ``STACK_DIR`` / ``STACK_HOST`` / ``STACK_PORT_BASE`` /
    ``STACK_ALLOWED_HOSTS``, else those saved at the first start, else the defaults."""
    directory = Path(directory or os.environ.get("STACK_DIR") or DEFAULT_DIR)
    saved_file = directory / SETTINGS_FILE
    saved = json.loads(saved_file.read_text()) if saved_file.is_file() else {}
    host = host or os.environ.get("STACK_HOST") or saved.get("host") or DEFAULT_HOST
    base_text = port_base or os.environ.get("STACK_PORT_BASE") or saved.get("port_base") or DEFAULT_PORT_BASE
    try:
        base = int(base_text)
    except ValueError:
        raise SettingsError(f"STACK_PORT_BASE: {base_text!r} is not a port number") from None
    if allowed_hosts is None:
        env_hosts = os.environ.get("STACK_ALLOWED_HOSTS")
        allowed_hosts = tuple(h for h in env_hosts.split(",") if h) if env_hosts is not None \
            else tuple(saved.get("allowed_hosts", ()))
    return StackSettings(directory=directory, host=host, port_base=base, allowed_hosts=allowed_hosts)
