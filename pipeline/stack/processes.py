"""Processes the stack starts: detached (a session of their own, so a closed terminal leaves them
running), output to a log file, their PID recorded; stopped by that PID and its process group only
(never by name), waiting until the process and every process of its group have exited."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pipeline.stack.groups import TAG_VARIABLE, new_tag, write_record


class StackError(RuntimeError):
    """A service could not start or stop: one message that says which and why."""


def pid_alive(pid: int, marker: str = "") -> bool:
    """Whether ``pid`` runs, and (given ``marker``) is still the program that was recorded: a PID
    the kernel reused for something else does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            return False
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, IndexError):
        return False
    return marker in cmdline


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def recorded_pid(pid_file: Path, marker: str) -> int | None:
    """The recorded PID when that process still runs (and is the recorded program), else None."""
    pid = read_pid(pid_file)
    return pid if pid is not None and pid_alive(pid, marker) else None


def start_detached(argv: Sequence[str], env: Mapping[str, str], log_file: Path, pid_file: Path,
                   cwd: Path) -> int:
    """Start ``argv`` in a session and process group of its own, stdout and stderr appended to
    ``log_file``, its environment tagged; record its PID (the group's ID) and the tag (``groups``)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    tag = new_tag()
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(list(argv), env={**env, TAG_VARIABLE: tag}, cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                umask=0o077)   # what it creates (weed's gRPC sockets in /tmp too) is its owner's
    write_record(pid_file, proc.pid, tag)
    return proc.pid


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of the group still answer; count only live members.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, IndexError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout_s: float = 30.0, group: bool = True) -> None:
    """Send ``sig`` to ``pid`` (and, with ``group``, to the process group it leads), wait until all
    have exited; SIGKILL after ``timeout_s``."""
    def send(s: int) -> None:
        try:
            if group:
                os.killpg(pid, s)
            else:
                os.kill(pid, s)
        except ProcessLookupError:
            pass

    def alive() -> bool:
        return _group_alive(pid) if group else pid_alive(pid)

    send(sig)
    deadline = time.monotonic() + timeout_s
    while alive():
        if time.monotonic() > deadline:
            send(signal.SIGKILL)
            deadline = time.monotonic() + 10.0
            timeout_s = -1
        time.sleep(0.1)
        if timeout_s < 0 and time.monotonic() > deadline:
            raise StackError(f"process {pid} did not exit after SIGKILL")
    try:
        os.waitpid(pid, os.WNOHANG)   # reap it when this process started it (tests)
    except ChildProcessError:
        pass


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on (or holds) ``host:port``: try to bind it as a server
    would (SO_REUSEADDR: connections of a stopped server waiting out TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float, log_file: Path | None = None,
               pid: int | None = None) -> None:
    """Poll ``ready`` until true; a process that died, or a timeout, is a StackError quoting its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except Exception:   # noqa: BLE001 - not up yet, whatever the client library raises
            pass
        if pid is not None and not pid_alive(pid):
            raise StackError(f"{what} exited while starting{log_tail(log_file)}")
        if time.monotonic() > deadline:
            raise StackError(f"{what} not ready after {timeout_s:.0f} s{log_tail(log_file)}")
        time.sleep(0.25)


def log_tail(log_file: Path | None, lines: int = 15) -> str:
    if log_file is None or not log_file.is_file():
        return ""
    tail = log_file.read_text(errors="replace").splitlines()[-lines:]
    return f"; the end of {log_file}:\n  " + "\n  ".join(tail)


def run_checked(argv: Sequence[str], what: str, env: Mapping[str, str] | None = None,
                input_text: str | None = None) -> str:
    """Run a short command; a failure is a StackError with its output."""
    proc = subprocess.run(list(argv), env=None if env is None else dict(env), input=input_text,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc.stdout
