"""Offline buffering: logging never slows or stops training. Metrics (and tags) go through a queue
to a background thread that sends them in batches; if the tracking server goes away, they wait in
memory (retried on every later flush) and training goes on. What could still not be sent when the
stage ends is written to ``reports/mlflow_unsent.json`` (git-ignored) with a warning on stderr."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from transformer.atomic import write_json

UNSENT_FILE = Path("reports/mlflow_unsent.json")


class BackgroundLogger:
    """Sends metrics to one run from a daemon thread, in batches, never raising into the caller."""

    MAX_PENDING = 200_000  # metrics kept while the server is away (about 40 MB)

    def __init__(self, c: MlflowClient, run_id: str, flush_seconds: float = 5.0) -> None:
        self.client, self.run_id, self.flush_seconds = c, run_id, flush_seconds
        self.queue: queue.Queue[Metric | RunTag | None] = queue.Queue()
        self.pending: list[Metric] = []
        self.pending_tags: dict[str, RunTag] = {}   # the newest value of each tag
        self.failures = 0
        self.warned = False
        self.thread = threading.Thread(target=self._loop, name="mlflow-logger", daemon=True)
        self.thread.start()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        for key, value in metrics.items():
            self.queue.put(Metric(key, float(value), now, step))

    def tag(self, key: str, value: str) -> None:
        self.queue.put(RunTag(key, value))

    def _send(self) -> None:
        if self.pending_tags:
            try:
                self.client.log_batch(self.run_id, tags=list(self.pending_tags.values()), synchronous=True)
                self.pending_tags.clear()
            except Exception:   # kept and retried with the metrics below, which warn
                pass
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
                if isinstance(item, RunTag):
                    self.pending_tags[item.key] = item
                else:
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
