"""``python -m pipeline.workers start``: ``prefect worker start`` with SIGINT at its default action,
whatever the starting shell left it at, polling its pool's default queue and a queue of its own
(``pipeline.workers.queues``).

A background job of a non-interactive shell (``... &`` in a script, and all it starts) inherits
SIGINT ignored. Prefect's worker answers its first SIGINT by restoring the handler it found
(ignore) and signalling itself SIGINT again, which then does nothing: it never stops, and a second
SIGINT makes it SIGKILL itself, leaving its flow run to the heartbeat automation (docs/team.md). A
service manager starts it with default dispositions; this does the same from any shell, then execs
the worker (same PID, so a PID file or ``kill`` reaches the worker itself).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.workers.queues import DEFAULT_QUEUE, WORKER_QUEUE_VAR, own_queue

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class WorkerStartError(RuntimeError):
    pass


def prefect_executable() -> str:
    """The ``prefect`` beside this Python (the clone's ``.venv``), else the one on PATH."""
    beside = Path(sys.executable).with_name("prefect")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("prefect")
    if not found:
        raise WorkerStartError(f"no prefect executable beside {sys.executable} or on PATH: `make setup stack-deps` "
                               "in this clone installs it")
    return found


def worker_command(pool: str, name: str, extra: Sequence[str]) -> list[str]:
    """``prefect worker start`` polling the pool's default queue and the worker's own
    (``pipeline.workers.queues``), one flow run at a time unless ``extra`` says ``--limit``: the runs
    share the worker's workspace; queues named in ``extra`` replace the default one."""
    queues = [] if {"-q", "--work-queue"} & set(extra) else ["--work-queue", DEFAULT_QUEUE]
    limit = [] if any(arg == "--limit" or arg.startswith("--limit=") for arg in extra) else ["--limit", "1"]
    return [prefect_executable(), "worker", "start", "--pool", pool, "--name", name, *queues,
            "--work-queue", own_queue(name), *limit, *extra]


def exec_worker(command: Sequence[str], queue: str) -> None:
    """Exec ``command`` with SIGINT and SIGTERM at their default actions and unblocked (both survive
    an exec as the shell left them), ``TEAM_WORKER_QUEUE`` naming the worker's own ``queue`` for its
    flow runs; does not return."""
    os.environ[WORKER_QUEUE_VAR] = queue
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], list(command))
