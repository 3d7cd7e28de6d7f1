"""A queue of its own for every worker, so that a flow run can go back to the worker that has its
files: a sweep's point crashed mid-training resumes from the checkpoints in that worker's
workspace (``pipeline.workers.sweep``).

``python -m pipeline.workers start --pool P --name N`` makes the work queue ``on-N`` in pool ``P``
(Prefect's worker refuses a queue that does not exist) and starts the worker polling the pool's
``default`` queue, where every deployment's runs go, and ``on-N``; the worker's flow runs find the
queue's name in ``TEAM_WORKER_QUEUE`` (a process worker's runs inherit its environment).
"""

from __future__ import annotations

import os
import socket

WORKER_QUEUE_VAR = "TEAM_WORKER_QUEUE"
DEFAULT_QUEUE = "default"
QUEUE_PREFIX = "on-"


def worker_name(name: str | None) -> str:
    """The worker's name: the one given, else the host's name (one worker per host by default)."""
    return name or socket.gethostname()


def own_queue(name: str) -> str:
    """The queue only the worker ``name`` polls."""
    return f"{QUEUE_PREFIX}{name}"


def current_queue() -> str:
    """The queue of the worker running this flow run ("" when its worker is not ours)."""
    return os.environ.get(WORKER_QUEUE_VAR, "")


def ensure_queue(pool: str, queue: str) -> None:
    """Create the work pool (a process pool, as a deployment would) and its queue ``queue`` unless
    they exist."""
    from prefect import get_client
    from prefect.exceptions import ObjectAlreadyExists

    from pipeline.workers.deploy import ensure_pool

    with get_client(sync_client=True) as client:
        ensure_pool(client, pool)
        try:
            client.create_work_queue(name=queue, work_pool_name=pool,
                                     description="the flow runs only this worker may take: a point resuming "
                                                 "from the checkpoints in its workspace")
        except ObjectAlreadyExists:
            pass
