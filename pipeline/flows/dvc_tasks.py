"""Prefect tasks that run the DVC stages: ``dvc repro --single-item <stage>`` one stage a task,
in the DAG's order, or one ``dvc exp run -S key=value ...`` for a run with parameter overrides.
In a clone with a default DVC remote (a team's, ``python -m pipeline.stack remote``) they pull
first (``--pull``): a stage whose outputs, or whose run-cache entry, another machine pushed is
restored from the remote instead of run again.

The stage's output (DVC's and the stage command's stdout and stderr) is streamed line by line
into the task's Prefect log. A failing stage raises ``StageFailed`` carrying the stage's own
``error: ...`` line. Retries are for transient failures only: a stage that exits 2 (bad params,
bad data, an unusable checkpoint: ``pipeline.stages.runner.run_stage``) fails at once, except a
download that could not reach its source.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipeline.stages.parent_death import with_parent_death_signal

STAGES = ("download", "references", "tokenizer", "train", "average", "export", "tune", "evaluate")   # dvc.yaml's order
USER_ERROR = 2                       # run_stage's exit status for bad params, data or checkpoints
NETWORK_ERROR = "could not download"  # pipeline.data.fetch.fetch_file, after its own retries
STOP_GRACE_S = 60.0                  # a train stage saves its checkpoint well within this
_EXITED = re.compile(r"exited with (-?\d+)")
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.\-\[\]]*=.*$")

# (retries, delays in seconds between attempts) per stage. A retried train stage resumes from its
# newest checkpoint (models/checkpoints is a persist: true output), so a retry loses little work.
RETRIES: dict[str, tuple[int, list[float]]] = {
    "download": (3, [10, 60, 180]),
    "references": (3, [10, 60, 180]),   # downloads too
    "tokenizer": (1, [10]),
    "train": (2, [30, 120]),
    "average": (1, [10]),
    "export": (1, [10]),
    "tune": (1, [30]),
    "evaluate": (1, [30]),
    "experiment": (1, [30]),
    "dvc add": (1, [10]),
}


class StageFailed(RuntimeError):
    """A DVC command failed; the message is the stage's own error (its last stderr lines)."""

    def __init__(self, command: list[str], returncode: int, stage_returncode: int | None, stderr: list[str]) -> None:
        self.command, self.returncode, self.stage_returncode = command, returncode, stage_returncode
        self.stderr = stderr
        errors = [line for line in stderr if line.startswith("error:")] or stderr[-5:]
        status = f"stage exited with {stage_returncode}" if stage_returncode is not None else f"exit {returncode}"
        super().__init__(f"{' '.join(command[2:])} failed ({status}): " + " | ".join(errors))

    def __reduce__(self) -> tuple[Any, ...]:   # picklable, should Prefect persist the failed state
        return StageFailed, (self.command, self.returncode, self.stage_returncode, self.stderr)

    @property
    def transient(self) -> bool:
        """Worth a retry: anything but a user error, and a download that could not reach its source."""
        if self.stage_returncode != USER_ERROR:
            return True
        return any(NETWORK_ERROR in line for line in self.stderr)


def _retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except StageFailed as err:
        return err.transient
    except ValueError:  # DataError, ParamsError: a retry would meet the same data and params
        return False
    except Exception:  # noqa: BLE001 (anything else, e.g. an OSError starting dvc: retry)
        return True
    return False


def dvc_env() -> dict[str, str]:
    """The environment of DVC and its stages: this one, with this interpreter's bin first on PATH
    (stage commands say ``python``) and unbuffered output (so lines stream as they come)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_dvc(args: list[str], workdir: Path, logger: Any = None) -> list[str]:
    """Run ``dvc <args>`` in ``workdir``, logging stdout (INFO) and stderr (WARNING) lines as they
    come; returns the stdout lines, raises ``StageFailed`` on a non-zero exit."""
    command = [sys.executable, "-m", "dvc", *args]
    launched = with_parent_death_signal(command)   # this process SIGKILLed: DVC gets SIGTERM (parent_death)
    logger = logger or get_run_logger()
    logger.info("$ dvc %s  (in %s)", " ".join(args), workdir)
    # A session of its own: when this process is interrupted (a worker stopped with SIGINT forwards it
    # here), stop_stage signals DVC and the stage together, once, and waits for them.
    process = subprocess.Popen(launched, cwd=workdir, env=dvc_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, encoding="utf-8", errors="replace", bufsize=1, start_new_session=True)
    stdout: list[str] = []
    stderr: deque[str] = deque(maxlen=200)

    def pump(stream: Any, sink: Any, level: int) -> None:
        for line in stream:
            line = line.rstrip("\n")
            if line.strip():
                sink.append(line)
                logger.log(level, "%s", line)

    threads = [threading.Thread(target=pump, args=(process.stdout, stdout, logging.INFO), daemon=True),
               threading.Thread(target=pump, args=(process.stderr, stderr, logging.WARNING), daemon=True)]
    for t in threads:
        t.start()
    try:
        returncode = process.wait()
    except BaseException:
        stop_stage(process, logger)
        raise
    for t in threads:
        t.join()
    if returncode != 0:
        exited = [int(m.group(1)) for line in stderr for m in [_EXITED.search(line)] if m]
        error = StageFailed(command, returncode, exited[-1] if exited else None, list(stderr))
        logger.error("%s", error)
        raise error
    return stdout


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_stage(process: subprocess.Popen, logger: Any, grace_s: float = STOP_GRACE_S) -> None:
    """SIGINT to DVC and its stage (the train stage saves a checkpoint and exits; DVC records
    nothing in dvc.lock), then SIGKILL to whatever of the two is left after ``grace_s``: an
    interrupted flow run never leaves a stage running on its own."""
    pgid = process.pid   # start_new_session: DVC leads its own process group
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        return
    logger.warning("interrupted: stopping dvc (pid %d) and its stage", pgid)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        process.poll()   # reaps DVC, which would otherwise keep the group alive as a zombie
        if not _group_alive(pgid):
            return
        time.sleep(0.2)
    logger.error("dvc and its stage did not stop within %.0f s of SIGINT: killed", grace_s)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def check_stages(workdir: Path) -> None:
    """The flows know the DAG's order: fail early if dvc.yaml's stages are not ``STAGES``."""
    dvc_yaml = workdir / "dvc.yaml"
    if not dvc_yaml.is_file():
        raise FileNotFoundError(f"{dvc_yaml} does not exist: workdir must be the repository root")
    stages = list((yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {}))
    if stages != list(STAGES):
        raise RuntimeError(f"dvc.yaml has stages {stages}, the flows run {list(STAGES)}: "
                           "update pipeline/flows/dvc_tasks.py")


def check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        if not _OVERRIDE.match(item):
            raise ValueError(f"parameter override {item!r} is not key=value (e.g. train.max_steps=100)")


def default_remote(workdir: Path) -> str:
    """The name of the clone's default DVC remote (``core.remote`` of any config level), "" if none."""
    proc = subprocess.run([sys.executable, "-m", "dvc", "config", "core.remote"], cwd=workdir, env=dvc_env(),
                          capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _pull_flag(pull: bool) -> list[str]:
    return ["--pull"] if pull else []


@task(name="dvc repro", cache_policy=NO_CACHE, retry_condition_fn=_retry_if_transient)
def repro_stage(stage: str, workdir: str, pull: bool = False) -> None:
    """One stage: ``dvc repro --single-item <stage>`` (a no-op when DVC finds it up to date); with
    ``pull``, missing outputs and run-cache entries are fetched from the default remote first."""
    run_dvc(["repro", *_pull_flag(pull), "--single-item", stage], Path(workdir))


@task(name="dvc exp run", cache_policy=NO_CACHE, retry_condition_fn=_retry_if_transient)
def experiment(overrides: list[str], workdir: str, pull: bool = False) -> None:
    """The whole DAG with parameter overrides, as a DVC experiment: ``dvc exp run -S k=v ...``.
    DVC leaves a successful experiment applied to the workspace; after a failed one the flow puts
    params.yaml back as it was (DVC would leave the overrides there for the next run to trip on)."""
    args = ["exp", "run", *_pull_flag(pull)]
    for item in overrides:
        args += ["-S", item]
    params_file = Path(workdir) / "params.yaml"
    before = params_file.read_bytes() if params_file.is_file() else None
    try:
        run_dvc(args, Path(workdir))
    except StageFailed:
        if before is not None and params_file.read_bytes() != before:
            params_file.write_bytes(before)
            get_run_logger().warning("params.yaml restored: the failed experiment's overrides are not kept")
        raise


@task(name="dvc add incoming", cache_policy=NO_CACHE, retry_condition_fn=_retry_if_transient)
def version_incoming(workdir: str, incoming_dir: str, src_lang: str, tgt_lang: str) -> list[str]:
    """Version the incoming pairs with ``dvc add`` (one ``.dvc`` file beside each file); returns
    their paths. A half pair (or a ``.dvc`` file whose data is missing) fails here, before training."""
    from pipeline.data.corpus import incoming_pairs

    root = Path(workdir)
    directory = Path(incoming_dir) if Path(incoming_dir).is_absolute() else root / incoming_dir
    pairs = incoming_pairs(directory, src_lang, tgt_lang)
    files = [str(path.relative_to(root) if path.is_relative_to(root) else path)
             for _, src, tgt in pairs for path in (src, tgt)]
    logger = get_run_logger()
    if not files:
        logger.info("no incoming pairs in %s", directory)
        return []
    logger.info("incoming pairs: %s", ", ".join(name for name, _, _ in pairs))
    run_dvc(["add", *files], root, logger)
    logger.info("versioned %d file(s); commit their .dvc files and dvc.lock to keep the record", len(files))
    return files


def stage_task(stage: str) -> Any:
    retries, delays = RETRIES[stage]
    return repro_stage.with_options(name=stage, task_run_name=f"dvc repro {stage}", retries=retries,
                                    retry_delay_seconds=delays)


def experiment_task() -> Any:
    retries, delays = RETRIES["experiment"]
    return experiment.with_options(task_run_name="dvc exp run", retries=retries, retry_delay_seconds=delays)


def version_task() -> Any:
    retries, delays = RETRIES["dvc add"]
    return version_incoming.with_options(retries=retries, retry_delay_seconds=delays)
