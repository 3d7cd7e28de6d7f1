"""MLflow: the one place that talks to the tracking store and the model registry.

One run per training. The train stage creates it, the average, tune and evaluate stages log
into the same run. When a later stage reruns with parameters that differ from those already
logged (``dvc exp run -S evaluate.beam_size=1``), it logs into a child run that carries all
the parent's parameters with its own on top, so every set of parameters has its own row in
``make compare``.

Stages find their run by content, never by an id written into their outputs (DVC hashes those,
and a run id differs on every machine): the run is tagged with the sha256 of the files it made
(``link.*`` tags: each checkpoint of the training, the averaged model, the model tune chose
decoding settings for), and a later stage, or a resumed training, looks up the newest run
tagged with the sha256 of the file it reads (``find_run``).

A run is named for what it is: ``<preset>-<dataset>-<pair>-<params hash>@<commit>`` (the hash
of the tracked params, so two runs of the same recipe share it). Every registered model version
carries a model card (``describe_version``): its description, which the MLflow UI shows, says
what the model is, what it was trained on, how long and on what hardware, its scores with their
sacreBLEU signatures, the decoding settings and where they came from, and its limits; tags on
the version carry the same figures for search (``bleu.test_2016_flickr``, ``preset``, ...).

The default store is embedded: SQLite at the repository root (``mlflow.db``) with
artifacts beside it (``mlartifacts/``). ``MLFLOW_TRACKING_URI`` points everything at a team
server instead.

Logging never slows or stops training: metrics go through a queue to a background thread
that sends them in batches. If the tracking server goes away, the batches wait in memory
(retried on every later flush) and training goes on; what could still not be sent when
the stage ends is written to ``reports/mlflow_unsent.json`` with a warning on stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
import yaml
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from transformer.atomic import file_sha256, write_json
from transformer.trainer import Trainer, TrainerCallback

DEFAULT_DB = "mlflow.db"
DEFAULT_ARTIFACTS = "mlartifacts"
UNSENT_FILE = Path("reports/mlflow_unsent.json")
TRAIN_SECONDS = "time/train_seconds"   # training wall time so far, logged at each checkpoint and at the end
# Tags linking a run to the files it made (values: the file's sha256); see find_run.
LINK_CHECKPOINT = "link.checkpoint_sha256"   # every checkpoint the training wrote (the newest last)
LINK_MODEL = "link.model_sha256"             # models/model.pt, on the run the average stage logged into
LINK_TUNED = "link.tuned_model_sha256"       # models/model.pt, on the run the tune stage logged into
LINK_TRAINING = "link.training_sha256"       # the trainer's fingerprint (model, settings, data): what a
                                             # resumed training falls back to when its checkpoint's tag was lost


def fingerprint_sha256(fingerprint: Mapping[str, Any]) -> str:
    """sha256 of a trainer's fingerprint (``Trainer.fingerprint``), the same on every machine."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True, default=str).encode()).hexdigest()
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


def device_name(device: str) -> str:
    """What ``device`` is: the GPU's name for ``cuda``, the CPU's model name for ``cpu``."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    if device.startswith("mps"):
        return f"Apple {platform.machine()} (MPS)"
    try:   # Linux: the model name; platform.processor() there is only the architecture
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine() or 'unknown CPU'} ({os.cpu_count()} CPUs)"


# What the pipeline itself rewrites while it runs (DVC's lock file and the git-tracked reports): a
# change there is a result, not a local change of the code or params the run was made from.
PIPELINE_WRITES = ("dvc.lock", "reports")


def run_tags(dataset: str, pair: str, device: str) -> dict[str, str]:
    commit = _git("rev-parse", "HEAD")
    excluded = [f":(exclude,top){path}" for path in PIPELINE_WRITES]
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", ":/", *excluded))
    return {
        "git.commit": commit or "unknown",
        "git.dirty": str(dirty).lower() if commit else "unknown",
        "dataset": dataset, "language_pair": pair, "device": device, "device.name": device_name(device),
        "torch.version": torch.__version__, **data_hashes(),
    }


def params_hash(params: Mapping[str, Any]) -> str:
    """A short hash of the params: the same recipe gives the same hash, whatever the key order."""
    text = json.dumps({k: _param_value(v) for k, v in sorted(params.items())}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def run_name(params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """``<preset>-<dataset>-<pair>-<params hash>@<commit>`` (``+dirty`` when the tree had local
    changes): says what was trained, with what recipe, from which code; MLflow's default is a
    random pair of words."""
    commit = tags.get("git.commit", "unknown")
    code = "nogit" if commit == "unknown" else commit[:7] + ("+dirty" if tags.get("git.dirty") == "true" else "")
    parts = [str(params.get("model.preset", "model")), tags.get("dataset", "data"), tags.get("language_pair", "")]
    return "-".join(p for p in parts if p) + f"-{params_hash(params)}@{code}"


def _param_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


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


def best_effort(action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a tracking call; a failure is a warning, never the end of the stage's work."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        print(f"warning: MLflow {action} failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr, flush=True)
        return None


def find_run(tag: str, sha256s: str | Iterable[str], experiment: str, c: MlflowClient | None = None,
             where: str = "") -> str | None:
    """The newest run of ``experiment`` tagged ``tag`` = one of ``sha256s`` (tried in order): the
    run that made a file, found by the file's content. None when no run is tagged so (the file was
    made without tracking, or in another store) or the store cannot be reached (a warning).
    ``c``: the store to search (default: ``client()``'s); ``where``: a further MLflow filter clause."""
    values = [sha256s] if isinstance(sha256s, str) else list(sha256s)
    try:
        c = c or client()
        found = c.get_experiment_by_name(experiment)
        if found is None:
            return None
        for value in values:
            runs = c.search_runs([found.experiment_id],
                                 filter_string=f"tags.`{tag}` = '{value}'" + (f" and {where}" if where else ""),
                                 order_by=["attributes.start_time DESC"], max_results=1)
            if runs:
                return runs[0].info.run_id
    except Exception as err:
        print(f"warning: MLflow run lookup failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr,
              flush=True)
    return None


def link_run(run_id: str | None, tag: str, sha256: str) -> None:
    """Tag ``run_id`` as the maker of the file whose sha256 is given (``find_run`` finds it)."""
    if run_id:
        best_effort("link tag", client().set_tag, run_id, tag, sha256)


def training_lengths(trainer: Trainer) -> dict[str, str]:
    """Source lengths (in pieces) the model saw in training, as tags: the model card's length limit."""
    try:
        lengths = trainer.train_data.lengths["src"]
        return {"data.train_src_tokens.max": str(int(lengths.max())),
                "data.train_src_tokens.p99": str(int(np.percentile(lengths, 99)))}
    except (AttributeError, KeyError, TypeError, ValueError):   # another kind of data, or none
        return {}


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

    def restore(self, checkpoints: Iterable[Path], history: Iterable[tuple[int, Mapping[str, float]]] = (),
                fingerprint: Mapping[str, Any] | None = None) -> None:
        """Continue the run that wrote ``checkpoints`` (newest first; the first one tagged wins), else
        the newest unfinished run of the same ``fingerprint`` (a process killed within seconds of a
        checkpoint had not sent its tag yet). ``history``: every (step, metrics) the run logged up to
        the checkpoint (the curves kept in it); those the run lacks are sent again when training
        starts, since a killed process loses what its background logger had not sent yet."""
        self.run_id = find_run(LINK_CHECKPOINT, (file_sha256(p) for p in checkpoints), self.experiment)
        if self.run_id is None and fingerprint is not None:
            self.run_id = find_run(LINK_TRAINING, fingerprint_sha256(fingerprint), self.experiment,
                                   where="attributes.status != 'FINISHED'")
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

    def on_checkpoint(self, step: int, path: Path) -> None:
        if self.logger:   # through the background thread: a slow or lost server never holds training
            self.logger.tag(LINK_CHECKPOINT, file_sha256(path))
            if self.trainer is not None:
                self.logger.log({TRAIN_SECONDS: self._train_seconds(self.trainer)}, step)

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
            run = c.create_run(experiment_id(self.experiment, c), run_name=name, tags=dict(self.tags))
            self.run_id = run.info.run_id
            print(f"MLflow: run {self.run_id} in experiment {self.experiment!r} at {tracking_uri()}", flush=True)
        log_params(c, self.run_id, {**self.params, **{f"derived.{k}": v for k, v in self.derived.items()}})
        c.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in self.tags.items()])

    def on_train_start(self, trainer: Trainer) -> None:
        self.tags = {**self.tags, "params.hash": params_hash(self.params),
                     "device.processes": str(getattr(trainer, "world_size", 1)),
                     "train.precision_used": str(getattr(trainer, "precision", "unknown")),   # auto, resolved
                     **training_lengths(trainer)}
        if hasattr(trainer, "fingerprint"):
            self.tags[LINK_TRAINING] = fingerprint_sha256(trainer.fingerprint())
        best_effort("run start", self._open_run)
        self.trainer = trainer
        if self.run_id is not None and self.client is not None:
            self.logger = BackgroundLogger(self.client, self.run_id)
            best_effort("history check", self._send_missing_history)
            if trainer.step and not trainer.config.max_minutes:   # a time budget restores its own clock
                self.seconds_before = best_effort("time check", self._seconds_before, trainer.step) or 0.0

    def _seconds_before(self, step: int) -> float:
        """The training time the run had logged at ``step`` (the checkpoint resumed from): checkpoints
        hold no time (they are DVC outputs), so the run keeps it for the model card."""
        assert self.client is not None and self.run_id is not None
        logged = [m for m in self.client.get_metric_history(self.run_id, TRAIN_SECONDS) if m.step <= step]
        return max(logged, key=lambda m: m.step).value if logged else 0.0

    def _train_seconds(self, trainer: Trainer) -> float:
        return self.seconds_before + trainer.elapsed_seconds

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(metrics, step)

    def on_validate(self, step: int, metrics: dict[str, float]) -> None:
        if self.logger:
            self.logger.log(metrics, step)

    def on_train_end(self, trainer: Trainer) -> None:
        if self.logger:
            # The model card's "how long": wall time, updates and epochs of the whole training.
            self.logger.log({TRAIN_SECONDS: self._train_seconds(trainer), "train/updates": trainer.step,
                             "train/epochs": trainer.epoch}, trainer.step)
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
        print(f"MLflow: no run of experiment {experiment!r} in {tracking_uri()} is tagged as the maker of this "
              f"stage's input; {stage} is not tracked", file=sys.stderr)
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
    # Links stay with the run that made the file; the child is linked to what its stage makes.
    tags = {k: v for k, v in parent.data.tags.items() if not k.startswith(("mlflow.", "link."))}
    child = c.create_run(parent.info.experiment_id, tags={**tags, "mlflow.parentRunId": run_id,
                                                          "changed_params": ",".join(conflicts)},
                         run_name=f"{parent.info.run_name}-{stage}-{params_hash(section_params)}")
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


# ----------------------------------------------------------------------------- model card

# What each data set's text is: the card's domain limit. Unknown data sets get a generic line.
DOMAINS = {
    "multi30k": "image captions (Flickr30k photo descriptions): short, literal, present-tense descriptions of "
                "everyday scenes; expect much weaker output on news, dialogue, technical or legal text",
    "wmt14": "news, parliament proceedings and web text (WMT 2014: Europarl, Common Crawl, News Commentary); "
             "weaker on conversational, medical or technical text",
}
DESCRIPTION_LIMIT = 5000   # MLflow's SQL store column for a model version's description


def _number(value: Any, digits: int = 0) -> str:
    try:
        return f"{float(value):,.{digits}f}"
    except (TypeError, ValueError):
        return "unknown"


def _plain(value: Any) -> str:
    """A number as a tag value ("1234", "56.7"); "" when there is none."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return str(int(number)) if number.is_integer() else f"{number:.1f}"


def _duration(seconds: Any) -> str:
    try:
        s = int(round(float(seconds)))
    except (TypeError, ValueError):
        return "unknown"
    h, rest = divmod(s, 3600)
    return (f"{h} h " if h else "") + f"{rest // 60} min {rest % 60} s"


def scores_of_test_sets(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The test sets' entries of the evaluate stage's ``metrics.json``: those with a BLEU score and
    its signature (not the ``dev`` and ``decoding`` entries)."""
    return {k: v for k, v in metrics.items() if isinstance(v, Mapping) and "bleu" in v and "signature" in v}


def model_card(name: str, version: str, run: Any, *, metrics: Mapping[str, Any], decoding: Mapping[str, Any],
               model_config: Mapping[str, Any], corpus_stats: Mapping[str, Any] | None = None,
               updates: int | None = None) -> tuple[str, dict[str, str]]:
    """The model card of a registered version of ``run``'s model: (markdown description, tags).

    Args:
        run: the MLflow run (params, tags and metrics of train, average and evaluate).
        metrics: the evaluate stage's ``reports/metrics.json`` (scores, signatures, ``dev``).
        decoding: beam_size, alpha, max_len_b, precision (and ``*_from``: where each came from).
        model_config: the checkpoint's ``model_config``.
        corpus_stats: ``data/corpus/stats.json`` of the download stage (cleaning counts, sources).
        updates: training updates, when the run lacks ``train/updates`` (runs before it was logged).
    """
    p, t, m = run.data.params, run.data.tags, run.data.metrics
    preset, dataset, pair = p.get("model.preset", "custom"), t.get("dataset", "unknown"), t.get("language_pair", "")
    src, tgt = (pair.split("-") + ["?", "?"])[:2]
    cfg = model_config
    updates = m.get("train/updates", updates)
    epochs = m.get("train/epochs")
    scores = scores_of_test_sets(metrics)
    dev = next(iter((metrics.get("dev") or {}).items()), None)

    def origin(key: str) -> str:
        where = decoding.get(f"{key}_from") or t.get(f"decoding.{key}_from")
        return {"tune": "tuned on the validation set (reports/tune.json)",
                "params": f"params.yaml evaluate.{key}"}.get(where, where or f"evaluate.{key}")

    lines = [
        f"# {name} version {version}", "",
        f"A Transformer (Vaswani et al. 2017) that translates {src} to {tgt}: preset `{preset}`, "
        f"{_number(p.get('derived.parameters'))} parameters, a shared SentencePiece vocabulary of "
        f"{_number(p.get('derived.vocab_size', cfg.get('vocab_size')))} pieces (d_model {cfg.get('d_model')}, "
        f"{cfg.get('n_encoder_layers')}+{cfg.get('n_decoder_layers')} layers, {cfg.get('n_heads')} heads, "
        f"{cfg.get('max_positions')} positions).", "",
        "## Scores", "",
        "| test set | BLEU | chrF | sentences |", "|---|---:|---:|---:|",
        *[f"| {s} | {v['bleu']:.2f} | {v.get('chrf', float('nan')):.2f} | {v.get('sentences', '?')} |"
          for s, v in scores.items()],
        "",
        *[f"- {s}: sacreBLEU `{v['signature']}`" + (f", chrF `{v['chrf_signature']}`" if v.get("chrf_signature")
                                                    else "") for s, v in scores.items()],
    ]
    if dev:
        lines.append(f"- validation ({dev[0]}, the development set that chose decoding and promotion): "
                     f"BLEU {dev[1].get('bleu', float('nan')):.2f}")
    lines += [
        "", "## Decoding", "",
        f"Beam size {decoding.get('beam_size')} ({origin('beam_size')}), length penalty alpha "
        f"{decoding.get('alpha')} ({origin('alpha')}), output up to source length + {decoding.get('max_len_b')} "
        f"pieces, {decoding.get('precision', 'fp32')}. The served model uses these unless a request's "
        "`params` set `beam_size` / `alpha`.",
        "", "## Training data", "",
    ]
    train_split = (corpus_stats or {}).get("splits", {}).get("train", {})
    cleaning = ""
    if train_split:
        dropped = ", ".join(f"{k} {v:,}" for k, v in train_split.get("dropped", {}).items() if v) or "none"
        cleaning = f" of {train_split.get('raw', 0):,} raw (dropped: {dropped})"
    lines.append(f"Data set `{dataset}`, {pair}: {_number(p.get('derived.train_pairs'))} training pairs after "
                 f"cleaning{cleaning}; validation set `{p.get('data.valid_set', '?')}`, test sets "
                 f"{', '.join(f'`{s}`' for s in scores) or 'none'}.")
    hashes = {k.removeprefix("data.md5."): v for k, v in t.items() if k.startswith("data.md5.")}
    if hashes:
        lines.append("Data hashes (dvc.lock md5): " + ", ".join(f"`{k}` {v}" for k, v in sorted(hashes.items())) + ".")
    for source in (corpus_stats or {}).get("sources", [])[:4]:
        lines.append(f"- source {source.get('url')} (sha256 {str(source.get('sha256'))[:16]}...)")
    commit = t.get("git.commit", "unknown")
    used = m.get("average/checkpoints_used")
    averaged = (f"the average of the last {int(used)} checkpoint(s) (average.last_n {p.get('average.last_n', '?')})"
                if used is not None else f"checkpoint average of the last {p.get('average.last_n', '?')}")
    lines += [
        "", "## Training", "",
        f"{_number(updates)} updates, {_number(epochs)} complete epochs, {_duration(m.get('time/train_seconds'))} "
        f"of training wall time on {t.get('device', 'unknown')} ({t.get('device.name', 'unknown device')}, "
        f"{t.get('device.processes', '1')} process(es)), torch {t.get('torch.version', 'unknown')}, training "
        f"precision {t.get('train.precision_used', p.get('train.precision', 'unknown'))}; {averaged}. "
        f"MLflow run `{run.info.run_id}` ({run.info.run_name}), git commit "
        f"`{commit[:12]}`{' with local changes' if t.get('git.dirty') == 'true' else ''}.",
        "", "## Limits", "",
        f"- Domain: {DOMAINS.get(dataset, f'the text of {dataset}; other domains will be translated worse')}.",
        "- Casing: trained on cased, untokenized text (never lowercased) and scored cased (sacreBLEU "
        "`case:mixed`); write input with normal casing and punctuation.",
        f"- Length: training sources were at most {p.get('data.max_words', '?')} words "
        + (f"and {t['data.train_src_tokens.max']} pieces (99% within {t['data.train_src_tokens.p99']}); "
           if "data.train_src_tokens.max" in t else "; ")
        + f"the model has {_number(cfg.get('max_positions', 1) - 1)} source positions and longer input is "
          "refused by the served model; quality drops well before that on sentences longer than those seen.",
        f"- One sentence per input: {src} in, {tgt} out; other languages are not recognised.",
    ]
    description = "\n".join(lines) + "\n"
    if len(description) > DESCRIPTION_LIMIT:
        description = description[:DESCRIPTION_LIMIT - 20] + "\n\n(truncated)\n"

    tags = {
        "preset": str(preset), "dataset": dataset, "language_pair": pair,
        "params": str(p.get("derived.parameters", "unknown")), "vocab_size": str(p.get("derived.vocab_size", "")),
        "train_pairs": str(p.get("derived.train_pairs", "")), "train.updates": _plain(updates),
        "train.epochs": _plain(epochs), "train.seconds": _plain(m.get("time/train_seconds")),
        "device": t.get("device", "unknown"), "device.name": t.get("device.name", "unknown"),
        "torch.version": t.get("torch.version", "unknown"), "git.commit": commit,
        "params.hash": t.get("params.hash", ""), "run_name": run.info.run_name or "",
        **{f"decoding.{k}": str(v) for k, v in decoding.items()},
        **{f"data.md5.{k}": v for k, v in hashes.items()},
    }
    for s, v in scores.items():
        tags.update({f"bleu.{s}": f"{v['bleu']:.2f}", f"sacrebleu.{s}": v["signature"]})
        if "chrf" in v:
            tags[f"chrf.{s}"] = f"{v['chrf']:.2f}"
    if dev:
        tags[f"bleu.dev.{dev[0]}"] = f"{dev[1].get('bleu', float('nan')):.2f}"
    return description, {k: v for k, v in tags.items() if v}


def describe_version(name: str, version: str, run_id: str, **card: Any) -> None:
    """Write the model card (``model_card``'s description and tags) onto a registered version."""
    c = client()
    run = c.get_run(run_id)
    if card.get("updates") is None and "train/updates" not in run.data.metrics:
        # Runs before train/updates was logged: the last step of the loss curve is the update count.
        history = c.get_metric_history(run_id, "train/loss")
        card["updates"] = max((h.step for h in history), default=None)
    description, tags = model_card(name, version, run, **card)
    c.update_model_version(name, version, description=description)
    for key, value in tags.items():
        c.set_model_version_tag(name, version, key, value[:5000])


def log_tune(run_id: str | None, report: Mapping[str, Any], report_file: Path, seconds: float,
             point_seconds: Iterable[float] = ()) -> None:
    """The tune stage's record in ``run_id``: ``valid_bleu`` (validation BLEU of the chosen beam size
    and alpha: what sweeps rank runs by), the chosen point's chrF and length ratio, the whole grid as
    a table artifact (``tune/grid.json``, read back by ``MlflowClient.load_table``; with each point's
    decoding time, which the report file leaves out) and ``report_file``."""
    if not run_id:
        return
    chosen = report["chosen"]
    log_metrics(run_id, {"valid_bleu": chosen["bleu"], "tune/valid_chrf": chosen["chrf"],
                         "tune/valid_length_ratio": chosen["length_ratio"], "time/tune_seconds": seconds})
    grid = [dict(point) for point in report["grid"]]
    for point, point_time in zip(grid, point_seconds):
        point["seconds"] = point_time
    if grid:
        table = {key: [point[key] for point in grid] for key in grid[0]}
        best_effort("table", client().log_table, run_id, table, "tune/grid.json")
    log_artifacts(run_id, [report_file], "tune")
