"""What every service of the stack has: a name, its ports, a recorded PID, a log, a health check."""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from pipeline.stack.groups import listening_ports, read_record, tagged_members
from pipeline.stack.processes import recorded_pid, stop_pid
from pipeline.stack.secrets import StackSecrets
from pipeline.stack.settings import StackSettings


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str


class Service(ABC):
    name: str
    port_names: tuple[str, ...]
    marker: str                      # a piece of the recorded process's command line (PID reuse check)
    stop_signal: int = signal.SIGTERM
    stop_group: bool = True          # the recorded PID leads a process group of its own (started detached)
    start_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0     # after the stop signal, SIGKILL to what is left

    def __init__(self, settings: StackSettings, secrets: StackSecrets) -> None:
        self.settings, self.secrets = settings, secrets

    @property
    def pid_file(self) -> Path:
        return self.settings.path("run", f"{self.name}.pid")

    @property
    def log_file(self) -> Path:
        return self.settings.path("logs", f"{self.name}.log")

    def pid(self) -> int | None:
        return recorded_pid(self.pid_file, self.marker)

    @abstractmethod
    def start(self) -> int:
        """Start the service, wait until it answers; returns its PID."""

    @abstractmethod
    def health(self) -> Health:
        """Ask the running service whether it serves (a request, not just a PID check)."""

    def address(self) -> str:
        return f"{self.settings.host}:{self.settings.port(self.port_names[0])}"

    def leftovers(self) -> list[int]:
        """Processes of the service's recorded group still running after its leader died (a crash,
        ``kill -9``): uvicorn's workers keep the MLflow port, for one."""
        record = read_record(self.pid_file)
        if record is None or self.pid() is not None:
            return []
        return tagged_members(record.pid, record.tag)

    def leftover_ports(self) -> list[int]:
        return listening_ports(self.leftovers())

    def stop(self) -> bool:
        """Stop by the recorded PID and wait until it (and its children) have exited, or end the
        leftovers of its group; False if nothing of it was running."""
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, self.stop_signal, timeout_s=self.stop_timeout_s, group=self.stop_group)
        record = read_record(self.pid_file)
        # The leader gone (now, or in a crash), what is left of its group gets the signal as a group.
        stray = tagged_members(record.pid, record.tag) if record is not None else []
        if stray:
            stop_pid(record.pid, signal.SIGTERM, timeout_s=15.0, group=True)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None or bool(stray)
