"""DVC stage ``train``: train the Transformer (§5) with the package's Trainer.

Checkpoints go to a ``persist: true`` folder: when the stage is interrupted (killed,
pre-empted) and run again, training resumes from the newest checkpoint. When the model,
training settings, data or initial weights changed since that checkpoint, training starts over
instead.

Fine-tuning: with ``train.init_from`` set, a training that does not resume starts from that
model's weights (``transformer.training.train_config.TrainConfig``); ``tokenizer.model_from`` made the token
stores with the tokenizer those weights were trained with.

Several devices (§5.2): ``train.processes`` (a number, or ``auto`` = every visible GPU) makes the
stage start them itself with PyTorch's elastic launcher (``pipeline.stages.launch``), inside
``dvc repro``; several hosts take their rendezvous from ``PIPELINE_*`` variables (docs/two_hosts.md).
An outer ``torchrun -m pipeline.stages.train`` still works: the stage then launches nothing. NCCL on
GPUs, gloo on CPUs; rank 0 writes checkpoints, curves and the MLflow run. ``train.max_tokens`` counts
one update's tokens in all processes: each takes ``max_tokens // processes`` per batch
(``launch.per_process``). A rerun resumes every rank from the newest checkpoint of any host
(``Trainer.resume``).

A lost peer ends training with a one-line error, not a hang: a process that dies closes its
connections and the others stop at once; a peer that goes silent (a host powered off, a network
cut) counts as lost after ``TRAIN_DIST_TIMEOUT_S`` seconds (default 300) without an answer. That
is an environment variable, not a params.yaml key, because it changes nothing in what is trained.
It must exceed the longest time rank 0 works alone while the others wait in their next
all-reduce: validation and writing a checkpoint (gloo's own default, 30 minutes, would leave a
host hanging that long).

A run cut by the ``train.max_minutes`` clock before its ``max_steps`` or ``max_epochs`` writes a
resume point and fails the stage (exit 1, as a signal's stop does: DVC records nothing); a run
meant to end on the clock sets both to 0 (the sweeps' proxy runs: params/sweep.yaml).

Writes ``reports/train_metrics.json``, the DVC metric, what ``dvc metrics show`` prints
(docs/metrics.md)::

    {"steps", "epochs", "parameters", "valid_ppl"}   # updates, epochs begun, model size, final val ppl

what the run reached, never how long it took (that goes to MLflow and the console). The final
validation's loss and NLL are the last row of ``reports/valid_curve.csv`` (a DVC plot), every logged
value the curves and the MLflow run.
"""

from __future__ import annotations

if __name__ == "__main__":
    # The allocator first (pipeline/stages/malloc.py: tcmalloc where installed), before torch and MLflow
    # load: starting the stage again then costs an interpreter's start, not their imports (1.8 s).
    # Only as a program: a caller running ``main`` in its own process (a test) is never started again.
    from pipeline.config.errors import ParamsError, exit_2_on
    from pipeline.stages.malloc import restart_on_chosen_malloc

    exit_2_on((ParamsError,), restart_on_chosen_malloc)

import argparse
import json
import math
import os
import re
import signal
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipeline import tracking
from pipeline.config import paths
from pipeline.config.data import DataParams
from pipeline.config.errors import ParamsError
from pipeline.config.loader import Sections, load_sections
from pipeline.config.model import ModelSection
from pipeline.config.tokenizer import TokenizerParams
from pipeline.config.tracking import TrackingParams
from pipeline.config.train import TrainSection, check_init_files
from pipeline.data.spec import DataError
from pipeline.figures.curves import CurveWriter
from pipeline.stages import launch
from pipeline.stages.runner import run_stage
from pipeline.text.names import CHECKPOINT_KEY as TEXT_FORM_KEY
from pipeline.text.names import TextForm, text_form_of
from transformer.atomic import file_sha256, write_json
from transformer.model import Transformer
from transformer.training.token_store import TokenStore
from transformer.training.trainer import Trainer, TrainerCallback, list_checkpoints

if TYPE_CHECKING:
    from pipeline.tracking.callback import MlflowCallback
    from transformer.training.train_config import TrainConfig

TRACKED_SECTIONS = ("data", "tokenizer", "model", "train", "tracking")
DIST_TIMEOUT_ENV = "TRAIN_DIST_TIMEOUT_S"
DEFAULT_DIST_TIMEOUT_S = 300.0
# How gloo and NCCL word a peer that died or went silent (any other error of theirs is no lost peer).
PEER_FAILURE = re.compile(r"connection (reset|closed|refused)|closed by peer|broken pipe|timed out|timeout|"
                          r"read error|write error|remote process exited", re.IGNORECASE)


def dist_timeout() -> float:
    """Seconds without an answer after which a peer counts as lost (``TRAIN_DIST_TIMEOUT_S``)."""
    text = os.environ.get(DIST_TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text.strip() else DEFAULT_DIST_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):   # timedelta refuses inf
        raise ParamsError(f"{DIST_TIMEOUT_ENV}={text!r}: expected a positive number of seconds")
    return seconds


def init_distributed() -> int:
    """Join the process group torchrun describes (WORLD_SIZE > 1); returns this process's rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(seconds=dist_timeout()))
    return dist.get_rank() if dist.is_initialized() else 0


def lost_peer(err: BaseException) -> str:
    """One line for a collective that failed because a peer died or went silent ("" for any other
    error). gloo's message names the peer's address, the source file of gloo that raised it and a
    paragraph of advice; this keeps the address and the reason, and says what to do."""
    text = str(err)
    collective = isinstance(err, dist.DistError) or "gloo" in text or "NCCL" in text
    if not (dist.is_initialized() and collective and PEER_FAILURE.search(text)):
        return ""
    rank, world = dist.get_rank(), dist.get_world_size()
    reason = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text.strip().splitlines()[0])
    reason = reason.split(". This is typically caused by")[0].strip().rstrip(".")
    who = f"rank {1 - rank}" if world == 2 else "another rank"   # of two, the lost one is the other
    how = (f"no answer for {DIST_TIMEOUT_ENV}={dist_timeout():g} s" if re.search("timed out|timeout", reason, re.I)
           else "its process or host stopped")
    return (f"rank {rank} of {world} lost {who} ({how}): {reason}; rerun the same command on every host "
            "to resume from the newest checkpoint")


def open_store(split: str) -> TokenStore:
    """The token store of ``split``; ``DataError`` (one line naming it) when missing or unreadable."""
    path = paths.token_store(split)
    try:
        return TokenStore(path)
    except FileNotFoundError as err:
        raise DataError(f"{err}: run the tokenizer stage first (dvc repro)") from None
    except (OSError, ValueError, KeyError) as err:   # a truncated .npy, a broken meta.json
        raise DataError(f"token store {path} cannot be read ({type(err).__name__}: {err}): "
                        "run the tokenizer stage again (dvc repro -f tokenizer)") from None


def tokenizer_sha256() -> str:
    """The sha256 of the tokenizer that made the token stores (part of the trainer's fingerprint);
    ``DataError`` when it is missing."""
    try:
        return file_sha256(paths.TOKENIZER_MODEL)
    except OSError as err:
        raise DataError(f"{paths.TOKENIZER_MODEL} cannot be read ({type(err).__name__}): "
                        "run the tokenizer stage first (dvc repro tokenizer)") from None


def tokens_text_form() -> TextForm:
    """The text form the tokenizer stage encoded the token stores in (its ``stats.json``; raw where it
    names none). ``DataError`` for a file that cannot be read or names an unknown form."""
    stats = paths.TOKENS_DIR / "stats.json"
    try:
        return text_form_of(json.loads(stats.read_text(encoding="utf-8")), str(stats))
    except (OSError, ValueError) as err:   # TextFormError is a ValueError
        raise DataError(f"{stats} cannot be read ({err}): run the tokenizer stage again (dvc repro -f tokenizer)"
                        ) from None


def check_init_form(init_from: str, form: TextForm) -> None:
    """Fine-tuning keeps the text form its initial weights were trained on: ``ParamsError`` when
    ``train.init_from`` names another than the token stores' (``tokenizer.text_form``)."""
    from transformer.checkpoint import CheckpointError, load_checkpoint

    try:
        theirs = text_form_of(load_checkpoint(init_from), init_from)
    except (CheckpointError, ValueError) as err:
        raise ParamsError(f"params.yaml: train.init_from {err}") from None
    if theirs.name != form.name:
        raise ParamsError(f"params.yaml: train.init_from {init_from} was trained on {theirs.name!r} text but the token "
                          f"stores hold {form.name!r} text (tokenizer.text_form): fine-tuning keeps its weights' "
                          f"form, set tokenizer.text_form to {theirs.name}")


class TextFormEntry(TrainerCallback):
    """Writes the text form into every checkpoint (``pipeline.text.forms``): the model says what it reads.
    Nothing for raw text, so a raw run's checkpoints are the bytes they always were."""

    def __init__(self, form: TextForm) -> None:
        self.form = form

    def checkpoint_state(self) -> dict[str, Any]:
        entry = self.form.entry()
        return {TEXT_FORM_KEY: entry} if entry is not None else {}


def mlflow_callback(params: Sections, trainer: Trainer, tracked: dict[str, object],
                    derived: dict[str, object]) -> MlflowCallback:
    """The trainer's MLflow hooks: one run per training, tagged with the data, device and starting
    weights. Imported here, so that with tracking off (``PIPELINE_TRACKING=off``) MLflow never is."""
    from pipeline.tracking.callback import MlflowCallback
    from pipeline.tracking.tags import run_tags

    tags = run_tags(params.data.dataset, params.data.pair, str(trainer.device))
    if trainer.init_sha256:
        tags["train.init_sha256"] = trainer.init_sha256   # the starting weights' identity, beside train.init_from
    return MlflowCallback(params.tracking.experiment, tracked, derived, tags)


def train(callbacks: list[TrainerCallback] | None = None) -> dict[str, float]:
    params = load_sections(DataParams, TokenizerParams, ModelSection, TrainSection, TrackingParams)
    check_init_files(params.train, params.tokenizer)   # fine-tuning's inputs, before any work
    record = tracking.enabled()   # a bad PIPELINE_TRACKING stops here, before any work
    rank = init_distributed()
    if record and rank == 0:
        tracking.check_credentials()   # 401/403: one line and exit 2, before any work
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    config_train = launch.per_process(params.train, world_size)   # max_tokens: one update's, in all processes
    train_data = open_store("train")
    valid_data = open_store(params.data.valid_set)
    form = tokens_text_form()
    if params.train.init_from:
        check_init_form(params.train.init_from, form)
    config = params.model.config(train_data.vocab_size)
    torch.manual_seed(params.train.seed)
    model = Transformer(config)
    curves = CurveWriter(paths.TRAIN_CURVE, paths.VALID_CURVE)
    tracked = {k: v for k, v in params.flat().items() if k.split(".")[0] in TRACKED_SECTIONS}
    derived = {"parameters": model.num_parameters(), "vocab_size": config.vocab_size,
               "train_pairs": len(train_data), "train_target_tokens": train_data.num_tokens("tgt")}
    if world_size > 1:   # MLflow's record of how the update was split (never a DVC output)
        derived.update(processes=world_size, max_tokens_per_process=config_train.max_tokens)
    try:
        trainer = Trainer(model, config_train, train_data, valid_data=valid_data,
                          checkpoint_dir=paths.CHECKPOINT_DIR,
                          callbacks=[TextFormEntry(form), *(callbacks or [])],
                          tokenizer_sha256=tokenizer_sha256())
    except ValueError as err:
        raise ParamsError(f"params.yaml: {err}") from None
    # Rank 0 keeps the curves and the MLflow run; the other ranks neither.
    mlflow_cb = mlflow_callback(params, trainer, tracked, derived) if rank == 0 and record else None
    if rank == 0:
        trainer.callbacks += [curves] + ([mlflow_cb] if mlflow_cb is not None else [])
    try:
        restored = trainer.resume(on_change="restart")
    except ValueError as err:   # hosts with other params or data than rank 0's
        raise ParamsError(str(err)) from None
    if restored is not None:
        if rank == 0:
            curves.restore(restored)
        if mlflow_cb is not None:
            # The run that wrote these checkpoints, found by their content (links.find_run).
            # Resume points too: a training stopped early may have tagged nothing else yet.
            mlflow_cb.restore(reversed(list_checkpoints(paths.CHECKPOINT_DIR, resume_points=True)),
                              history=curves.history(),
                              fingerprint=trainer.fingerprint())
        source = f" from {trainer.resumed_from}" if trainer.world_size > 1 else ""
        print(f"resuming from step {trainer.step} (epoch {trainer.epoch}){source}", flush=True)
    elif params.train.init_from:
        print(f"initialised from {params.train.init_from} (sha256 {trainer.init_sha256[:12]}): fine-tuning with a "
              "fresh optimiser and learning-rate schedule", flush=True)
    if rank == 0:
        print(f"model: {model.num_parameters():,} parameters, vocabulary {config.vocab_size}, "
              f"{len(train_data):,} training pairs, device {trainer.device}, precision {trainer.precision}, "
              f"{trainer.world_size} process(es)"
              + (f" of {config_train.max_tokens} tokens per batch" if world_size > 1 else ""), flush=True)
    start, first_step = time.monotonic(), trainer.step
    valid = trainer.train()
    if trainer.stopped_early and trainer.stopped_by.signal:
        # Preempted (SIGTERM/SIGINT on any rank): the resume point is written, the training is not
        # done. A non-zero exit keeps DVC from recording it and running average on a partial model.
        if dist.is_initialized():
            dist.destroy_process_group()
        raise StoppedBySignal(trainer.step, trainer.stop_signal or signal.SIGTERM)
    if trainer.stopped_early:
        # The max_minutes clock before max_steps or max_epochs: a resume point, not the training
        # asked for (its metrics would pair this step with an older validation, and average would
        # miss its last updates). Runs meant to end on the clock set max_steps and max_epochs to 0.
        if dist.is_initialized():
            dist.destroy_process_group()
        raise StoppedByClock(trainer.step, config_train)
    # A DVC metric: what the run reached, never how long it took (that goes to MLflow and the console).
    summary = {"steps": trainer.step, "epochs": trainer.epoch, "parameters": model.num_parameters(),
               **({"valid_ppl": valid["valid/ppl"]} if "valid/ppl" in valid else {})}   # none: stopped before
    if rank == 0:
        write_json(paths.TRAIN_METRICS, summary)
        print(end_line(trainer.step - first_step, time.monotonic() - start, first_step, summary), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return summary


def end_line(updates: int, seconds: float, resumed_from: int, summary: dict[str, object]) -> str:
    """What this run of the stage did: its own updates and seconds, and the step it resumed from."""
    resumed = f", resumed from step {resumed_from} (step {resumed_from + updates} now)" if resumed_from else ""
    return f"trained {updates} steps in {seconds:.1f} s{resumed}: {summary}"


class StoppedBySignal(Exception):
    """The training stopped early on a signal (any rank's): a resume point, not a finished training."""

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"train: stopped by signal {signum} after update {step}; its resume point is written: "
                         "run the stage again (dvc repro) to continue")
        self.signum = signum


class StoppedByClock(Exception):
    """The ``max_minutes`` clock ran out before the training's length: a resume point only."""

    EXIT_CODE = 1

    def __init__(self, step: int, config: TrainConfig) -> None:
        length = " and ".join(f"train.{key} {value}" for key, value in
                              (("max_steps", config.max_steps), ("max_epochs", config.max_epochs)) if value)
        super().__init__(f"train: the clock (train.max_minutes {config.max_minutes:g}) ran out after update {step}, "
                         f"before {length}; its resume point is written, the training is not done: raise "
                         "train.max_minutes (0 = no budget) and run the stage again to continue, or set "
                         "train.max_steps and train.max_epochs to 0 for a run that ends on the clock")


def launch_if_asked() -> int | None:
    """Start the training processes ``train.processes`` and ``PIPELINE_NNODES`` ask for, and return
    the stage's exit code; ``None`` when this process trains itself (one process on one host, or a
    rank an outer launcher started). What every rank would check first is checked once, here."""
    if launch.under_launcher():
        launch.exit_if_launcher_gone()
        return None
    params = load_sections(DataParams, TokenizerParams, ModelSection, TrainSection, TrackingParams)
    requested = TrainSection.requested_processes(params.raw.get("train") or {})
    rendezvous = launch.Rendezvous.from_env()
    processes = launch.processes_to_start(requested, params.train.device)
    if processes == 1 and rendezvous.nnodes == 1:
        return None
    check_init_files(params.train, params.tokenizer)
    if tracking.enabled():
        tracking.check_credentials()   # once, before any process starts
    dist_timeout()
    launch.per_process(params.train, processes * rendezvous.nnodes)   # as if every host starts as many
    open_store("train")
    open_store(params.data.valid_set)
    print(f"train: {processes} process(es) on this host, {rendezvous.nnodes} host(s); train.max_tokens "
          f"{params.train.max_tokens} per batch, shared out among all of them", flush=True)
    return launch.launch(processes, rendezvous, "pipeline.stages.train")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    code = launch_if_asked()
    if code is not None:
        sys.exit(code)
    try:
        train()
    except StoppedBySignal as stopped:
        print(stopped, file=sys.stderr, flush=True)
        sys.exit(128 + stopped.signum)   # as a process the signal ended (143 for SIGTERM): DVC records nothing
    except StoppedByClock as stopped:
        print(stopped, file=sys.stderr, flush=True)
        sys.exit(stopped.EXIT_CODE)      # DVC records nothing, and average never sees a partial training
    except RuntimeError as err:
        message = lost_peer(err)
        if not message:
            raise
        # Exit without destroying the process group: that would wait on the lost peer again.
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    run_stage(main)
