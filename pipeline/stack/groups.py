"""Which processes belong to a service of the stack, found without names.

Each service starts as the leader of a session and process group of its own; the recorded PID is
also the group's ID. Every process it starts (uvicorn's workers, PostgreSQL's backends) stays in
that group and inherits its environment, which carries a tag made for that one start
(``STACK_PROCESS_TAG``, recorded beside the PID). When the leader dies (``kill -9``) its group
lives on in the kernel as long as one member does, so the group ID cannot name anything else: its
members that carry the recorded tag are the service's leftovers, and stopping them signals that
group. Nothing here looks at a program's name."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic import write_text

TAG_VARIABLE = "STACK_PROCESS_TAG"


@dataclass(frozen=True)
class Record:
    """What ``<dir>/run/<service>.pid`` holds: the leader's PID (= its group's ID) and the start's tag."""

    pid: int
    tag: str | None


def new_tag() -> str:
    return secrets.token_hex(12)


def write_record(pid_file: Path, pid: int, tag: str) -> None:
    write_text(pid_file, f"{pid} {tag}\n")


def read_record(pid_file: Path) -> Record | None:
    try:
        fields = pid_file.read_text().split()
        return Record(int(fields[0]), fields[1] if len(fields) > 1 else None)
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _stat_fields(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError, PermissionError):
        return None


def _carries(pid: str, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def tagged_members(pgid: int, tag: str | None) -> list[int]:
    """Live (not zombie) processes of process group ``pgid`` that carry ``tag`` in their environment."""
    if not tag:
        return []
    marker = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        # After the command's ")": state, ppid, pgrp.
        if fields and fields[0] != "Z" and int(fields[2]) == pgid and _carries(entry.name, marker):
            found.append(int(entry.name))
    return sorted(found)


def listening_ports(pids: list[int]) -> list[int]:
    """The TCP ports these processes listen on (psutil; processes it may not inspect are left out)."""
    import psutil

    ports: set[int] = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        ports.update(c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN)
    return sorted(ports)


def port_holder(port: int) -> str:
    """Who listens on ``port`` on this machine, as far as this user may see: ``pid 12 (python3)``."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    return f"pid {conn.pid}"
    except psutil.AccessDenied:
        pass
    return "another program"
