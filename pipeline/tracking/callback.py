"""The trainer's hooks (``MlflowCallback``): one run per training, created or, after a kill,
continued (found through ``links``); params, tags and metric histories sent through the
background logger (``unsent.buffer``), the training time logged at each checkpoint and at the end.

A training that starts while the tracking server is away (or refuses it) has no run to log into:
it keeps what it would have logged (params, tags, every metric value, the checkpoint links, its
end) and hands it to the unsent queue at its end as the training's record (``records.train``),
which the next replay turns into the run, before the later stages' records that need it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from pipeline.tracking.failures import best_effort
from pipeline.tracking.links import LINK_CHECKPOINT, LINK_MODEL, LINK_TRAINING, find_run, fingerprint_sha256, lookup_run
from pipeline.tracking.runs import finish_run, log_params
from pipeline.tracking.store import client, experiment_id, safe_uri, tracking_uri
from pipeline.tracking.tags import params_hash, run_name, training_lengths
from pipeline.tracking.unsent import deferred
from pipeline.tracking.unsent.buffer import BackgroundLogger, save_unsent
from pipeline.tracking.unsent.records import train as train_record
from pipeline.tracking.unsent.records.train import LINEAGE, UNFINISHED
from transformer.atomic import file_sha256
from transformer.training.trainer import Trainer, TrainerCallback

TRAIN_SECONDS = "time/train_seconds"   # training wall time so far, logged at each checkpoint and at the end


class MlflowCallback(TrainerCallback):
    """Trainer hooks: create or resume the run, log params, tags and metric histories."""

    def __init__(self, experiment: str, params: Mapping[str, Any], derived: Mapping[str, Any],
                 tags: Mapping[str, str], run_name: str | None = None) -> None:
        self.experiment, self.params, self.derived, self.tags = experiment, params, derived, tags
        self.run_name = run_name
        self.run_id: str | None = None
        self.logger: BackgroundLogger | None = None
        self.client: MlflowClient | None = None
        self.trainer: Trainer | None = None
        self.seconds_before = 0.0   # training time of the processes before a resume (from the run)
        self.history: list[tuple[int, dict[str, float]]] = []
        self.continued_from: str | None = None   # the finished run whose checkpoint this training continues
        self.resumed_from: list[str] = []   # sha256s of the checkpoints it resumed from, newest first
        self.offline: dict[str, Any] | None = None   # the training's record, while no run could be opened

    def restore(self, checkpoints: Iterable[Path], history: Iterable[tuple[int, Mapping[str, float]]] = (),
                fingerprint: Mapping[str, Any] | None = None) -> None:
        """Continue the run that wrote ``checkpoints`` (newest first; the first one tagged wins), else
        the newest unfinished run of the same ``fingerprint`` (a process killed within seconds of a
        checkpoint had not sent its tag yet). ``history``: every (step, metrics) the run logged up to
        the checkpoint (the curves kept in it); those the run lacks are sent again when training
        starts, since a killed process loses what its background logger had not sent yet.

        Only an unfinished run (running, failed, killed) is continued: a finished run's model trained
        further (``train.max_steps`` raised) logs into a new run tagged ``lineage.continued_from_run``,
        so that a finished run, which a registered version may come from, never changes."""
        shas = [file_sha256(p) for p in checkpoints]
        self.resumed_from = shas
        self.run_id = find_run(LINK_CHECKPOINT, shas, self.experiment, where=UNFINISHED)
        if self.run_id is None and fingerprint is not None:
            self.run_id = find_run(LINK_TRAINING, fingerprint_sha256(fingerprint), self.experiment, where=UNFINISHED)
        if self.run_id is None and shas:
            self.continued_from = find_run(LINK_CHECKPOINT, shas, self.experiment)   # a finished run's
        self.history = [(step, dict(metrics)) for step, metrics in history]

    def _lineage(self) -> dict[str, str]:
        """The lineage tag of a new run: the finished run whose checkpoint it continues, else the run
        that made ``train.init_from`` (fine-tuning a registered model); {} for a training from scratch."""
        parent = self.continued_from
        init_from = self.params.get("train.init_from")
        if parent is None and init_from and Path(str(init_from)).is_file():
            sha = file_sha256(Path(str(init_from)))
            try:   # a lineage the store cannot tell is no reason to train unrecorded
                parent = lookup_run(LINK_MODEL, sha, self.experiment) or lookup_run(LINK_CHECKPOINT, sha,
                                                                                   self.experiment)
            except Exception as err:
                print(f"warning: MLflow lineage lookup of {init_from} failed ({type(err).__name__})", file=sys.stderr)
        return {LINEAGE: parent} if parent else {}

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
        if missing and self.continued_from:   # a new run: the curve up to the checkpoint it continues
            print(f"MLflow: logging the continued checkpoint's curve ({len(missing)} metric values, from run "
                  f"{self.continued_from}) into the new run", flush=True)
        elif missing:
            print(f"MLflow: sending again {len(missing)} metric values the interrupted run had not sent", flush=True)

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self.logger:   # through the background thread: a slow or lost server never holds training
            self.logger.tag(LINK_CHECKPOINT, file_sha256(path))
            if self.trainer is not None:
                self.logger.log({TRAIN_SECONDS: self._train_seconds(self.trainer)}, step)
        elif self.offline is not None:
            self.offline["link_tags"][LINK_CHECKPOINT] = file_sha256(path)
            if self.trainer is not None:
                self._keep({TRAIN_SECONDS: self._train_seconds(self.trainer)}, step)

    def _open_run(self) -> None:
        c = client()
        self.client = c
        if self.run_id is not None:
            try:
                c.get_run(self.run_id)
                c.update_run(self.run_id, "RUNNING")
                print(f"MLflow: resuming run {self.run_id}", flush=True)
            except Exception:
                print(f"MLflow: run {self.run_id} is not in {tracking_uri()}; starting a new one", flush=True)
                self.run_id = None
        if self.run_id is None:
            name = self.run_name or run_name(self.params, self.tags)
            self.tags = {**self.tags, **self._lineage()}
            run = c.create_run(experiment_id(self.experiment, c), run_name=name, tags=dict(self.tags))
            self.run_id = run.info.run_id
            print(f"MLflow: run {self.run_id} in experiment {self.experiment!r} at {safe_uri(tracking_uri())}",
                  flush=True)
            if LINEAGE in self.tags:
                print(f"MLflow: it continues the model of run {self.tags[LINEAGE]} (tag {LINEAGE}); that run "
                      "is finished and stays as it is", flush=True)
        log_params(c, self.run_id, {**self.params, **{f"derived.{k}": v for k, v in self.derived.items()}})
        c.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in self.tags.items()])

    def on_train_start(self, trainer: Trainer) -> None:
        self.tags = {**self.tags, "params.hash": params_hash(self.params),
                     "device.processes": str(getattr(trainer, "world_size", 1)),
                     "train.precision_used": str(getattr(trainer, "precision", "unknown")),   # auto, resolved
                     **training_lengths(trainer)}
        if hasattr(trainer, "fingerprint"):
            self.tags[LINK_TRAINING] = fingerprint_sha256(trainer.fingerprint())
        best_effort("unsent queue replay", deferred.replay, quiet=True)   # what waits goes first
        best_effort("run start", self._open_run)
        self.trainer = trainer
        if self.run_id is None or self.client is None:   # no run: everything is kept for the record
            self._go_offline()
            return
        best_effort("unsent queue", deferred.print_waiting)   # one line, while anything still waits
        if self.run_id is not None and self.client is not None:
            self.logger = BackgroundLogger(self.client, self.run_id)
            best_effort("history check", self._send_missing_history)
            if trainer.step and not trainer.config.max_minutes:   # a time budget restores its own clock
                self.seconds_before = best_effort("time check", self._seconds_before, trainer.step) or 0.0

    def _seconds_before(self, step: int) -> float:
        """The training time the run had logged at ``step`` (the checkpoint resumed from): checkpoints
        hold no time (they are DVC outputs), so the run keeps it for the model card."""
        assert self.client is not None and self.run_id is not None
        source = self.tags.get(LINEAGE) if self.continued_from else self.run_id   # a new run: its parent's time
        logged = [m for m in self.client.get_metric_history(source or self.run_id, TRAIN_SECONDS) if m.step <= step]
        return max(logged, key=lambda m: m.step).value if logged else 0.0

    def _train_seconds(self, trainer: Trainer) -> float:
        return self.seconds_before + trainer.elapsed_seconds

    def _go_offline(self) -> None:
        """Keep the run in memory: params, tags, the curve points the checkpoint holds, and from now
        on every value logged, for the training's record."""
        self.run_id, self.logger = None, None
        self.offline = {"experiment": self.experiment, "run_name": self.run_name or run_name(self.params, self.tags),
                        "start_time": int(time.time() * 1000), "end_time": None,
                        "params": {**self.params, **{f"derived.{k}": v for k, v in self.derived.items()}},
                        "tags": {k: str(v) for k, v in self.tags.items()}, "resumed_from": self.resumed_from,
                        "init_sha256": self.tags.get("train.init_sha256"), "metrics": [], "link_tags": {},
                        "status": None}
        for step, metrics in self.history:
            self._keep(metrics, step)
        print(f"warning: MLflow: no run at {safe_uri(tracking_uri())}; this training's params, metrics and "
              f"checkpoint links are kept and wait in the unsent queue from its end ({deferred.SENT_BY} sends "
              "them)", file=sys.stderr, flush=True)

    def _keep(self, metrics: Mapping[str, float], step: int) -> None:
        assert self.offline is not None
        now = int(time.time() * 1000)
        kept = self.offline["metrics"]
        kept += [[key, float(value), int(step), now] for key, value in metrics.items()]
        del kept[:-BackgroundLogger.MAX_PENDING]   # bounded like the live logger's backlog: the newest kept

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(metrics, step)
        elif self.offline is not None:
            self._keep(metrics, step)

    def on_validate(self, step: int, metrics: dict[str, float]) -> None:
        self.on_log(step, metrics)

    def _submit_offline(self, trainer: Trainer) -> None:
        """Hand the kept run to the unsent queue (sent at once if the server answers by now)."""
        assert self.offline is not None
        self._keep({TRAIN_SECONDS: self._train_seconds(trainer), "train/updates": trainer.step,
                    "train/epochs": trainer.epoch}, trainer.step)
        record, self.offline = self.offline, None
        record["end_time"] = int(time.time() * 1000)
        record["status"] = None if trainer.stop_requested else "FINISHED"   # a stopped training resumes later
        deferred.submit(train_record, record)   # a queue that cannot be written fails the stage: DVC reruns it

    def on_train_end(self, trainer: Trainer) -> None:
        if self.offline is not None:
            self._submit_offline(trainer)
            return
        if self.logger:
            # The model card's "how long": wall time, updates and epochs of the whole training.
            self.logger.log({TRAIN_SECONDS: self._train_seconds(trainer), "train/updates": trainer.step,
                             "train/epochs": trainer.epoch}, trainer.step)
            unsent = self.logger.close()
            save_unsent(self.run_id or "", unsent, {k: t.value for k, t in self.logger.pending_tags.items()})
            self.logger = None
        if not trainer.stop_requested:
            finish_run(self.run_id)
