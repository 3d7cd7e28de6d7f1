"""Offline buffering and replay: logging never slows or stops training, and nothing it could not
send is lost. Metrics (and tags) go through a queue to a background thread that sends them in
batches; if the tracking server goes away, they wait in memory (retried on every later flush) and
training goes on. What could still not be sent when the stage ends (metrics, tags, the run's end) is
added to ``reports/mlflow_unsent.json`` (git-ignored, not a DVC output) with a warning on stderr,
and ``replay_unsent`` sends it into the same runs once the server is back: at the start of the
next stage's run lookup (``links.find_run``) or by ``python -m pipeline.tracking.replay``."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Mapping

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from pipeline.tracking import failures
from pipeline.tracking.store import client
from pipeline.tracking.unsent import on_disk
from pipeline.tracking.unsent.on_disk import UNSENT_FILE, shown

__all__ = ["UNSENT_FILE", "BackgroundLogger", "replay_unsent", "save_unsent"]


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


def save_unsent(run_id: str, metrics: list[Metric], tags: Mapping[str, str] | None = None,
                status: str | None = None) -> None:
    """Keep what could not be sent to ``run_id`` (added to what the file already keeps): metric
    values, the newest value of tags, and the run's end status."""
    if not run_id or not (metrics or tags or status):
        return
    with on_disk.locked():
        doc = on_disk.load()
        entry = doc["runs"].setdefault(run_id, {"metrics": [], "tags": {}, "status": None})
        entry["metrics"] += [{"key": m.key, "value": m.value, "step": m.step, "timestamp": m.timestamp}
                             for m in metrics]
        entry["tags"].update(tags or {})
        entry["status"] = status or entry["status"]
        on_disk.save(doc)
    what = [f"{len(metrics)} metric values" if metrics else "", f"{len(tags)} tags" if tags else "",
            f"the run's end ({status})" if status else ""]
    print(f"warning: MLflow: {', '.join(w for w in what if w)} of run {run_id} could not be sent; kept in "
          f"{shown(on_disk.queue_file())}, sent when the server is back (next stage, or python -m "
          "pipeline.tracking.replay)",
          file=sys.stderr, flush=True)


def replay_unsent(c: MlflowClient | None = None, quiet: bool = False) -> int:
    """Send what ``save_unsent`` kept into the same runs; each run's part leaves the file once sent
    (a metric batch sent twice is stored once). Returns the number of runs still unsent (0 when the
    file is empty or absent); a server still away is a warning (none with ``quiet``: a stage's one
    waiting line says it), never an error; a run the server will not take for another reason (deleted,
    say) is set aside (``deferred``); refused credentials raise ``CredentialsRefused``, keeping all.
    The stages' waiting records are ``deferred.replay``'s, which calls this first."""
    if not on_disk.queue_file().is_file():   # nothing waits: no lock taken, so no lock file left behind
        return 0
    with on_disk.locked():
        doc = on_disk.load()
        runs = doc["runs"]
        if not runs:
            return 0
        try:
            c = c or client()
            for run_id in list(runs):
                entry = runs[run_id]
                metrics = [Metric(m["key"], float(m["value"]), int(m["timestamp"]), int(m["step"]))
                           for m in entry["metrics"]]
                try:
                    for i in range(0, len(metrics), 1000):   # MLflow's log_batch limit
                        c.log_batch(run_id, metrics=metrics[i:i + 1000], synchronous=True)
                        entry["metrics"] = entry["metrics"][1000:]
                    if entry["tags"]:
                        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in entry["tags"].items()], synchronous=True)
                    if entry["status"]:
                        c.set_terminated(run_id, entry["status"])
                except Exception as err:
                    if failures.classify(err) != failures.FAILED:
                        raise
                    aside = {"id": run_id[:12], "stage": "run", "run_id": run_id, "entry": runs.pop(run_id)}
                    on_disk.set_aside(doc, aside, failures.reason(err))
                    on_disk.print_set_aside(aside)
                    continue
                del runs[run_id]
                print(f"MLflow: replayed into run {run_id} what it could not send before: {len(metrics)} metric "
                      f"values, {len(entry['tags'])} tags{', its end' if entry['status'] else ''}", flush=True)
        except Exception as err:
            if failures.classify(err) == failures.REFUSED:
                on_disk.save(doc)
                raise failures.refusal(err) from None
            if not quiet:   # the server still away: keep the rest for the next try
                print(f"warning: MLflow replay of {shown(on_disk.queue_file())} failed ({failures.reason(err)}); "
                      "kept for the next try", file=sys.stderr, flush=True)
        on_disk.save(doc)
        return len(runs)
