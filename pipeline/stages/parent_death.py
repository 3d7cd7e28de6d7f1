"""A stage never outlives the process that started it.

When a Prefect worker is stopped it SIGKILLs its flow-run process (Prefect 3.8), which cannot pass
anything on: DVC and the stage it runs would go on as orphans, the stage writing outputs that no
``dvc.lock`` will record and holding DVC's lock against the next run. Linux's
``PR_SET_PDEATHSIG`` has the kernel send a signal to a process when its parent dies: the flow's
DVC gets it through ``setpriv --pdeathsig`` (``pipeline.flows.dvc_tasks``), every stage through
``signal_when_parent_dies`` (``pipeline.stages.runner.run_stage``), so SIGTERM travels down the chain and
the train stage saves its checkpoint and exits, as for any SIGTERM (§5's training resumes from it).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def signal_when_parent_dies(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for ``sig`` when this process's parent exits; False where it cannot (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:   # the parent died before the request: nobody will send it
        os.kill(os.getpid(), sig)
    return True


def with_parent_death_signal(argv: list[str], sig: str = "TERM") -> list[str]:
    """``argv`` run so that it gets SIG``sig`` when the caller dies (util-linux's ``setpriv``; as is
    where it is missing)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, f"--pdeathsig=SIG{sig}", "--", *argv] if setpriv else argv
