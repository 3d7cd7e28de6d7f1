"""MLflow: the one place that talks to the tracking store and the model registry.

One run per training. The train stage creates it (or resumes it: its id travels in every
checkpoint), the average and evaluate stages log into the same run (its id travels in the
averaged model file). When a later stage reruns with parameters that differ from those
already logged (``dvc exp run -S evaluate.beam_size=1``), it logs into a child run that
carries all the parent's parameters with its own on top, so every set of parameters has
its own row in ``make compare``.

The default store is embedded: SQLite at the repository root (``mlflow.db``) with
artifacts beside it (``mlartifacts/``). ``MLFLOW_TRACKING_URI`` points everything at a team
server instead.

Logging never slows or stops training: metrics go through a queue to a background thread
that sends them in batches. If the tracking server goes away, the batches wait in memory
(retried on every later flush) and training goes on; what could still not be sent when
the stage ends is written to ``reports/mlflow_unsent.json`` with a warning on stderr.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
import torch
import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from pipeline.io import write_json
from transformer.trainer import Trainer, TrainerCallback

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
UNSENT_FILE = Path("reports/mlflow_unsent.json")
RUN_ID_KEY = "mlflow_run_id"
CHAMPION_ALIAS = "champion"
# A tracking server that went away must cost seconds, not MLflow's default minutes of retries.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def _default_uri() -> str:
    return f"sqlite:///{Path(DEFAULT_DB).resolve()}"


def _user_uri() -> str:
    """The user's ``MLFLOW_TRACKING_URI``; ``mlflow.set_tracking_uri`` writes that variable
    too, so the embedded default found there does not count as the user's choice."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    return "" if uri == _default_uri() else uri


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the embedded SQLite store at the repository root."""
    return _user_uri() or _default_uri()


def client() -> MlflowClient:
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(uri, uri)


def experiment_id(name: str, c: MlflowClient | None = None) -> str:
    """The experiment's id, created on first use (artifacts beside the embedded store)."""
    c = c or client()
    found = c.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None if _user_uri() else Path(DEFAULT_ARTIFACTS).resolve().as_uri()
    return c.create_experiment(name, artifact_location=location)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def data_hashes(lock_file: Path = Path("dvc.lock")) -> dict[str, str]:
    """md5 of the data outputs recorded in ``dvc.lock`` (download and tokenizer stages)."""
    if not lock_file.is_file():
        return {}
    lock = yaml.safe_load(lock_file.read_text()) or {}
    hashes = {}
    for stage in ("download", "tokenizer"):
        for out in lock.get("stages", {}).get(stage, {}).get("outs", []):
            if out.get("md5"):
                hashes[f"data.md5.{out['path']}"] = out["md5"]
    return hashes


def run_tags(dataset: str, pair: str, device: str) -> dict[str, str]:
    commit = _git("rev-parse", "HEAD")
    return {
        "git.commit": commit or "unknown",
        "git.dirty": str(bool(_git("status", "--porcelain", "--untracked-files=no"))).lower() if commit else "unknown",
        "dataset": dataset, "language_pair": pair, "device": device, "torch.version": torch.__version__,
        **data_hashes(),
    }


def _param_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


class BackgroundLogger:
    """Sends metrics to one run from a daemon thread, in batches, never raising into the caller."""

    MAX_PENDING = 200_000  # metrics kept while the server is away (about 40 MB)

    def __init__(self, c: MlflowClient, run_id: str, flush_seconds: float = 5.0) -> None:
        self.client, self.run_id, self.flush_seconds = c, run_id, flush_seconds
        self.queue: queue.Queue[Metric | None] = queue.Queue()
        self.pending: list[Metric] = []
        self.failures = 0
        self.warned = False
        self.thread = threading.Thread(target=self._loop, name="mlflow-logger", daemon=True)
        self.thread.start()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        for key, value in metrics.items():
            self.queue.put(Metric(key, float(value), now, step))

    def _send(self) -> None:
        while self.pending:
            chunk = self.pending[:1000]  # MLflow's log_batch limit
            try:
                self.client.log_batch(self.run_id, metrics=chunk, synchronous=True)
            except Exception as err:  # server away, timeout, HTTP error: keep the batch, go on
                self.failures += 1
                if not self.warned:
                    print(f"warning: MLflow logging failed ({type(err).__name__}: {str(err)[:200]}); "
                          "training goes on, metrics are kept and retried", file=sys.stderr, flush=True)
                    self.warned = True
                del self.pending[:-self.MAX_PENDING]
                return
            del self.pending[:len(chunk)]

    def _loop(self) -> None:
        stop = False
        while not stop:
            deadline = time.monotonic() + self.flush_seconds
            while True:
                try:
                    item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                self.pending.append(item)
            self._send()

    def close(self, timeout: float = 60.0) -> list[Metric]:
        """Flush and stop; returns the metrics that could not be sent."""
        self.queue.put(None)
        self.thread.join(timeout)
        return list(self.pending)


def save_unsent(run_id: str, metrics: list[Metric]) -> None:
    if not metrics:
        return
    write_json(UNSENT_FILE, {"run_id": run_id, "metrics": [
        {"key": m.key, "value": m.value, "step": m.step, "timestamp": m.timestamp} for m in metrics]})
    print(f"warning: {len(metrics)} metric values could not be sent to MLflow; kept in {UNSENT_FILE}",
          file=sys.stderr, flush=True)


def best_effort(action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a tracking call; a failure is a warning, never the end of the stage's work."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        print(f"warning: MLflow {action} failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr, flush=True)
        return None


class MlflowCallback(TrainerCallback):
    """Trainer hooks: create or resume the run, log params, tags and metric histories."""

    def __init__(self, experiment: str, params: Mapping[str, Any], derived: Mapping[str, Any],
                 tags: Mapping[str, str], run_name: str | None = None) -> None:
        self.experiment, self.params, self.derived, self.tags = experiment, params, derived, tags
        self.run_name = run_name
        self.run_id: str | None = None
        self.logger: BackgroundLogger | None = None
        self.client: MlflowClient | None = None
        self.train_started = 0.0
        self.history: list[tuple[int, dict[str, float]]] = []

    def restore(self, state: Mapping[str, Any], history: Iterable[tuple[int, Mapping[str, float]]] = ()) -> None:
        """Continue the checkpoint's run. ``history``: every (step, metrics) the run logged up to the
        checkpoint (the curves kept in it); those the run lacks are sent again when training starts,
        since a killed process loses what its background logger had not sent yet."""
        self.run_id = state.get(RUN_ID_KEY) or None
        self.history = [(step, dict(metrics)) for step, metrics in history]

    def _send_missing_history(self) -> None:
        if not (self.history and self.run_id and self.client and self.logger):
            return
        by_key: dict[str, list[tuple[int, float]]] = {}
        for step, metrics in self.history:
            for key, value in metrics.items():
                by_key.setdefault(key, []).append((step, value))
        now, missing = int(time.time() * 1000), []
        for key, points in by_key.items():
            logged = {m.step for m in self.client.get_metric_history(self.run_id, key)}
            missing += [Metric(key, float(value), now, step) for step, value in points if step not in logged]
        for metric in missing:
            self.logger.queue.put(metric)
        if missing:
            print(f"MLflow: sending again {len(missing)} metric values the interrupted run had not sent", flush=True)

    def checkpoint_state(self) -> dict[str, Any]:
        return {RUN_ID_KEY: self.run_id} if self.run_id else {}

    def _open_run(self) -> None:
        c = client()
        self.client = c
        if self.run_id is not None:
            try:
                c.get_run(self.run_id)
                c.update_run(self.run_id, "RUNNING")
                print(f"MLflow: resuming run {self.run_id}", flush=True)
            except Exception:
                print(f"MLflow: run {self.run_id} of the checkpoint is not in {tracking_uri()}; starting a new one",
                      flush=True)
                self.run_id = None
        if self.run_id is None:
            run = c.create_run(experiment_id(self.experiment, c), run_name=self.run_name, tags=dict(self.tags))
            self.run_id = run.info.run_id
            print(f"MLflow: run {self.run_id} in experiment {self.experiment!r} at {tracking_uri()}", flush=True)
        log_params(c, self.run_id, {**self.params, **{f"derived.{k}": v for k, v in self.derived.items()}})
        c.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in self.tags.items()])

    def on_train_start(self, trainer: Trainer) -> None:
        best_effort("run start", self._open_run)
        if self.run_id is not None and self.client is not None:
            self.logger = BackgroundLogger(self.client, self.run_id)
            best_effort("history check", self._send_missing_history)
        self.train_started = time.monotonic()

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(metrics, step)

    def on_validate(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(metrics, step)

    def on_train_end(self, trainer: Trainer) -> None:
        if self.logger:
            self.logger.log({"time/train_seconds": trainer.elapsed_seconds}, trainer.step)
            save_unsent(self.run_id or "", self.logger.close())
            self.logger = None
        if not trainer.stop_requested:
            finish_run(self.run_id)


def log_params(c: MlflowClient, run_id: str, params: Mapping[str, Any]) -> list[str]:
    """Log params not yet on the run; returns the keys whose logged value differs (not re-logged)."""
    existing = c.get_run(run_id).data.params
    new, conflicts = [], []
    for key, value in params.items():
        text = _param_value(value)[:6000]
        if key not in existing:
            new.append(Param(key, text))
        elif existing[key] != text:
            conflicts.append(key)
    for i in range(0, len(new), 100):
        c.log_batch(run_id, params=new[i:i + 100])
    return conflicts


def stage_run(run_id: str | None, experiment: str, section_params: Mapping[str, Any], stage: str) -> str | None:
    """The run a later stage (average, evaluate) logs into: the training run, or a child run
    when this stage's params differ from those the training run already holds."""
    if not run_id:
        print(f"MLflow: the model carries no run id; {stage} is not tracked", file=sys.stderr)
        return None
    c = client()
    try:
        parent = c.get_run(run_id)
    except Exception as err:
        print(f"warning: MLflow run {run_id} not reachable ({type(err).__name__}); {stage} is not tracked",
              file=sys.stderr)
        return None
    conflicts = log_params(c, run_id, section_params)
    if not conflicts:
        return run_id
    tags = {k: v for k, v in parent.data.tags.items() if not k.startswith("mlflow.")}
    child = c.create_run(parent.info.experiment_id, tags={**tags, "mlflow.parentRunId": run_id,
                                                          "changed_params": ",".join(conflicts)},
                         run_name=f"{parent.info.run_name}-{stage}")
    log_params(c, child.info.run_id, {**parent.data.params, **section_params})
    print(f"MLflow: {stage} params differ from run {run_id} ({', '.join(conflicts)}); logging into child run "
          f"{child.info.run_id}", flush=True)
    return child.info.run_id


def log_metrics(run_id: str | None, metrics: Mapping[str, float], step: int = 0) -> None:
    if run_id:
        now = int(time.time() * 1000)
        best_effort("metrics", client().log_batch, run_id,
              metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def log_artifacts(run_id: str | None, files: Iterable[Path], artifact_path: str | None = None) -> None:
    if not run_id:
        return
    c = client()
    for f in files:
        if Path(f).is_dir():
            best_effort("artifacts", c.log_artifacts, run_id, str(f), artifact_path)
        elif Path(f).is_file():
            best_effort("artifact", c.log_artifact, run_id, str(f), artifact_path)


def finish_run(run_id: str | None, status: str = "FINISHED") -> None:
    if run_id:
        best_effort("run end", client().set_terminated, run_id, status)


def log_tune(run_id: str | None, report: Mapping[str, Any], report_file: Path, seconds: float) -> None:
    """The tune stage's record in ``run_id``: ``valid_bleu`` (validation BLEU of the chosen beam size
    and alpha: what sweeps rank runs by), the chosen point's chrF and length ratio, the whole grid as
    a table artifact (``tune/grid.json``, read back by ``MlflowClient.load_table``) and ``report_file``."""
    if not run_id:
        return
    chosen = report["chosen"]
    log_metrics(run_id, {"valid_bleu": chosen["bleu"], "tune/valid_chrf": chosen["chrf"],
                         "tune/valid_length_ratio": chosen["length_ratio"], "time/tune_seconds": seconds})
    grid = list(report["grid"])
    if grid:
        table = {key: [point[key] for point in grid] for key in grid[0]}
        best_effort("table", client().log_table, run_id, table, "tune/grid.json")
    log_artifacts(run_id, [report_file], "tune")
