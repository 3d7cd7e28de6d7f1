"""Training loop (§5): token-count batches, Adam with warm-up, label smoothing, checkpoints.

The Trainer knows nothing of trackers: the pipeline observes it through ``TrainerCallback``.
It runs on CUDA when present, else CPU, and under ``torchrun`` (DDP) without change.
Resume is exact: model, optimiser, schedule, RNG states and the position in the data
are all in the checkpoint, and the data order is a pure function of (seed, epoch).
Fine-tuning: ``TrainConfig.init_from`` starts a new training from another model's weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint import init_weights, load_checkpoint, load_state, save_checkpoint
from .data import TokenBatchSampler, TokenStore, collate
from .errors import CheckpointError, NonFiniteLossError, OutOfMemoryError  # noqa: F401  (API)
from .loss import label_smoothed_cross_entropy
from .model import Transformer
from .precision import autocast, check_precision, default_device, resolve_precision
from .schedule import make_optimizer, make_scheduler
from .train_config import TrainConfig

CHECKPOINT_PATTERN = re.compile(r"checkpoint_(\d+)\.pt$")
# TrainConfig fields that may change between a checkpoint and its resumption. ``init_from`` is a
# path: what counts is the file's content, its sha256 (``Trainer.fingerprint``'s "init"), so a moved
# copy of the same file resumes and other bytes at the same path restart.
RESUMABLE_CHANGES = {"max_steps", "max_epochs", "max_minutes", "log_every", "validate_every",
                     "checkpoint_every_steps", "checkpoint_every_minutes", "keep_checkpoints", "device",
                     "compile", "nan_policy", "init_from"}


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Flattened keys whose values differ between two nested dicts."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


class TrainerCallback:
    """Hooks the pipeline uses to observe training; every method is optional."""

    def on_train_start(self, trainer: Trainer) -> None: ...
    def on_log(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_validate(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_checkpoint(self, step: int, path: Path) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...
    def checkpoint_state(self) -> dict[str, Any]:
        """Extra (plain) values to store in each checkpoint, e.g. a tracking run id."""
        return {}


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints in ``directory``, oldest (lowest step) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.search(p.name))]
    return [p for _, p in sorted(found)]


def scaler_skipped(scale_before: float, scale_after: float) -> bool:
    """Whether ``GradScaler.step`` skipped the optimiser step (fp16 loss scaling).

    ``GradScaler.update`` multiplies the scale by ``backoff_factor`` (< 1) exactly when it found
    inf or NaN gradients, which is also exactly when ``step`` left the parameters alone; it only
    ever raises the scale otherwise. So a lower scale after ``update`` is the public sign of a
    skipped step (the flags themselves are private to the scaler).
    """
    return scale_after < scale_before


def _distributed() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Trainer:
    """Trains a ``Transformer`` on a ``TokenStore`` (§5)."""

    def __init__(self, model: Transformer, config: TrainConfig, train_data: TokenStore, *,
                 valid_data: TokenStore | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 callbacks: list[TrainerCallback] | None = None) -> None:
        self.config = config
        self.device = default_device() if config.device == "auto" else torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("TrainConfig.device is cuda but no GPU is visible")
        check_precision(config.precision, self.device)
        self.precision = resolve_precision(config.precision, self.device)
        self.rank, self.world_size = _distributed()
        if self.device.type == "cuda" and self.world_size > 1:
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
        torch.manual_seed(config.seed)
        self.model = model.to(self.device)
        # Fine-tuning: the starting weights go in before the optimiser, DDP (which broadcasts rank
        # 0's weights) and compile see the model. A resumed training overwrites them with its own
        # checkpoint in resume(); the file's sha256 is in the fingerprint, so another file restarts.
        self.init_sha256 = ""
        if config.init_from:
            try:
                self.init_sha256 = init_weights(self.model, config.init_from, map_location=self.device)
            except CheckpointError as err:
                raise CheckpointError(f"TrainConfig.init_from: {err}") from None
        self.pad_id = model.config.pad_id
        self.train_data, self.valid_data = train_data, valid_data
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.callbacks = callbacks or []
        self.optimizer = make_optimizer(model.parameters(), weight_decay=config.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, model.config.d_model, config.warmup_steps, config.lr_scale)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16" and self.device.type == "cuda")
        self.sampler = TokenBatchSampler(
            train_data.lengths["src"], train_data.lengths["tgt"], config.max_tokens, seed=config.seed,
            rank=self.rank, world_size=self.world_size, max_positions=model.config.max_positions,
            pad_multiple=config.pad_multiple)
        self.forward_model: nn.Module = model
        if self.world_size > 1:
            self.forward_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if config.compile:
            self.forward_model = torch.compile(self.forward_model, dynamic=True)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.elapsed_seconds = 0.0  # training wall time (across resumes only with a max_minutes budget)
        self.stop_requested = False
        self.last_valid: dict[str, float] = {}
        self.last_valid_step = -1
        self.resumed_from = ""   # the checkpoint resume() loaded, for messages

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for cb in self.callbacks:
            extra.update(cb.checkpoint_state())
        return {
            "model_config": self.model.config.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train_config": asdict(self.config),
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            # Wall time is kept only where it decides something (a ``max_minutes`` budget): a run
            # limited by updates or epochs writes the same checkpoint bytes on every machine.
            "elapsed_seconds": self.elapsed_seconds if self.config.max_minutes else 0.0,
            "last_valid": self.last_valid, "last_valid_step": self.last_valid_step,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "callbacks": extra,
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "checkpoint") -> None:
        load_state(self.model, state["model"], source)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.elapsed_seconds = state.get("elapsed_seconds", 0.0)
        # Absent from checkpoints written before they were saved: the step is then validated again.
        self.last_valid = dict(state.get("last_valid", {}))
        self.last_valid_step = state.get("last_valid_step", -1)
        # load_checkpoint maps every tensor to the training device; RNG states must be CPU tensors.
        torch.set_rng_state(state["rng_cpu"].cpu())
        if torch.cuda.is_available() and state["rng_cuda"]:
            # One state per GPU of the machine that saved it (dropout on CUDA draws from these);
            # a machine with fewer GPUs restores those it has rather than failing on the others.
            states = [s.cpu() for s in state["rng_cuda"]][:torch.cuda.device_count()]
            torch.cuda.set_rng_state_all(states)

    def fingerprint(self) -> dict[str, Any]:
        """What fixes the training trajectory: model and training settings, the data, and the
        starting weights when fine-tuning (the sha256 of the ``init_from`` file).

        Limits (max_steps, max_epochs, max_minutes), logging and checkpoint intervals are left
        out: raising a limit and resuming gives the same result as training longer from scratch.
        """
        train = {k: v for k, v in asdict(self.config).items() if k not in RESUMABLE_CHANGES}
        data = hashlib.sha1(self.train_data.offsets["src"].tobytes() + self.train_data.offsets["tgt"].tobytes())
        fingerprint = {"model": self.model.config.to_dict(), "train": train, "world_size": self.world_size,
                       "data": f"{len(self.train_data)}:{data.hexdigest()}"}
        if self.init_sha256:   # absent for random weights: checkpoints from before init_from existed still match
            fingerprint["init"] = self.init_sha256
        return fingerprint

    def resume(self, on_change: str = "error") -> dict[str, Any] | None:
        """Load the newest checkpoint of ``checkpoint_dir``, if any; returns its callback state.

        When that checkpoint was made with another model, settings or data (see
        ``fingerprint``), ``on_change="error"`` raises ``ValueError`` naming the differences and
        ``on_change="restart"`` deletes the old checkpoints and returns None (a fresh start).
        Under torchrun every rank resumes from the same checkpoint (``_newest_checkpoint``), and a
        rank whose settings or data differ from rank 0's raises ``ValueError`` on every rank.
        """
        if self.checkpoint_dir is None:
            return None
        if self.rank == 0 and self.checkpoint_dir.is_dir():  # writes a kill cut short (atomic_write's temp files)
            for stale in self.checkpoint_dir.glob(".checkpoint_*.tmp"):
                stale.unlink(missing_ok=True)
        checkpoints = list_checkpoints(self.checkpoint_dir)
        source, state = self._newest_checkpoint(checkpoints)
        if state is None:
            return None
        changes = _differences(state.get("fingerprint", {}), self.fingerprint())
        if changes:
            described = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(changes.items())[:6])
            if on_change != "restart":
                raise ValueError(f"{source} was trained with other settings ({described}); "
                                 f"delete {self.checkpoint_dir} to start over")
            print(f"settings changed since {source} ({described}): starting a new training", flush=True)
            for old in checkpoints:   # every rank decides alike (same state): each clears its own folder
                old.unlink(missing_ok=True)   # missing: another rank sharing the folder came first
            return None
        self.load_state_dict(state, source)
        self.resumed_from = source
        return state.get("callbacks", {})

    def _newest_checkpoint(self, checkpoints: list[Path]) -> tuple[str, dict[str, Any] | None]:
        """The checkpoint to resume from, as (its name for messages, its state), or ("", None).

        One process: the newest of ``checkpoints``. Under torchrun: the newest of every rank's
        ``checkpoint_dir``, read by the rank that holds it and sent to all. Only rank 0 writes
        checkpoints and hosts do not share a disk, so on a rerun the other ranks have none (or older
        ones, from a run where they were rank 0); DDP sends rank 0's weights when it wraps the model
        but not the optimiser, the schedule, the RNG or the position in the data, so a rank that
        started over on its own would train apart from the others without any error. The file's
        bytes travel rather than a loaded state so that every rank loads it alike (weights only,
        onto its own device). The ranks also compare fingerprints first: hosts with other params or
        token stores would train apart just as silently, so that is a ``ValueError`` on every rank.
        """
        if self.world_size == 1:
            if not checkpoints:
                return "", None
            return str(checkpoints[-1]), load_checkpoint(checkpoints[-1], map_location=self.device)
        newest = int(CHECKPOINT_PATTERN.search(checkpoints[-1].name).group(1)) if checkpoints else -1
        ranks: list[Any] = [None] * self.world_size
        dist.all_gather_object(ranks, (self.fingerprint(), newest))
        for rank, (fingerprint, _) in enumerate(ranks):
            changes = _differences(ranks[0][0], fingerprint)
            if changes:
                described = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(changes.items())[:6])
                raise ValueError(f"rank {rank} trains other settings or data than rank 0 ({described}): "
                                 "every host needs the same params.yaml and token stores")
        steps = [step for _, step in ranks]
        source = steps.index(max(steps))   # the lowest rank among those with the newest step
        if steps[source] < 0:
            return "", None
        payload = [checkpoints[-1].read_bytes() if self.rank == source else None]
        dist.broadcast_object_list(payload, src=source, device=self.device)
        name = f"rank {source}'s checkpoint_{steps[source]:08d}.pt"
        try:
            return name, torch.load(io.BytesIO(payload[0]), map_location=self.device, weights_only=True)
        except Exception as err:  # as load_checkpoint: torch raises several types for a bad file
            raise CheckpointError(f"{name} cannot be loaded: {type(err).__name__}: {err}") from err

    def checkpoint_path(self, step: int) -> Path:
        assert self.checkpoint_dir is not None
        return self.checkpoint_dir / f"checkpoint_{step:08d}.pt"

    def save(self) -> Path | None:
        """Write checkpoint_<step>.pt atomically (rank 0 only) and keep the newest K."""
        if self.checkpoint_dir is None or self.rank != 0:
            return None
        path = self.checkpoint_path(self.step)
        save_checkpoint(path, self.state_dict())
        for old in list_checkpoints(self.checkpoint_dir)[:-self.config.keep_checkpoints]:
            old.unlink(missing_ok=True)
        for cb in self.callbacks:
            cb.on_checkpoint(self.step, path)
        return path

    # -------------------------------------------------------------- training
    def _done(self, started: float) -> bool:
        c = self.config
        elapsed = self.elapsed_seconds + time.monotonic() - started
        return (self.stop_requested or (c.max_steps and self.step >= c.max_steps)
                or (c.max_epochs and self.epoch >= c.max_epochs)
                or (c.max_minutes and elapsed >= 60 * c.max_minutes))

    def _updates(self):
        """Yield the batches (index arrays) of each update, from the saved data position on."""
        while True:
            batches = self.sampler.batches(self.epoch)
            usable = len(batches) - len(batches) % self.config.update_freq
            while self.batch_in_epoch < usable:
                group = batches[self.batch_in_epoch:self.batch_in_epoch + self.config.update_freq]
                self.batch_in_epoch += self.config.update_freq
                yield group
                if self.batch_in_epoch >= usable:
                    break
            self.epoch += 1
            self.batch_in_epoch = 0
            yield None  # epoch boundary

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True

    def train(self) -> dict[str, float]:
        """Train until a limit is reached; returns the last validation metrics (if any)."""
        c = self.config
        handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                handlers[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread
                pass
        for cb in self.callbacks:
            cb.on_train_start(self)
        started = time.monotonic()
        last_ckpt_time = time.monotonic()
        window = {"loss": torch.zeros((), device=self.device), "nll": torch.zeros((), device=self.device),
                  "tokens": 0, "steps": 0, "time": time.monotonic()}
        grad_norm = torch.zeros(())
        self.model.train()
        try:
            updates = self._updates()
            while not self._done(started):
                group = next(updates)
                if group is None:  # end of an epoch; already validated when resuming at its checkpoint
                    if c.validate_every == 0 and self.last_valid_step != self.step:
                        self._validate()
                    continue
                loss_sum, nll_sum, n_tokens, update_norm, status = self._update(group)
                if status != "applied":
                    # Nothing was applied, so neither the step count nor the schedule moves (the
                    # batches are consumed: the data position is saved with the next checkpoint).
                    # fp16 overflows are the loss scaler's normal search for its scale, not a
                    # non-finite loss, so nan_policy "stop" does not apply to them.
                    if status == "non-finite" and c.nan_policy == "stop":
                        raise NonFiniteLossError(
                            f"non-finite loss at step {self.step + 1}; the last good checkpoint is kept")
                    continue
                grad_norm = update_norm
                self.step += 1
                window["loss"] += loss_sum
                window["nll"] += nll_sum
                window["tokens"] += n_tokens
                window["steps"] += 1
                if self.step % c.log_every == 0:
                    self._log(window, grad_norm)
                if c.validate_every and self.step % c.validate_every == 0:
                    self._validate()
                due_minutes = (c.checkpoint_every_minutes
                               and time.monotonic() - last_ckpt_time >= 60 * c.checkpoint_every_minutes)
                if (c.checkpoint_every_steps and self.step % c.checkpoint_every_steps == 0) or due_minutes:
                    self.elapsed_seconds += time.monotonic() - started
                    started = time.monotonic()
                    self.save()
                    last_ckpt_time = time.monotonic()
            if window["steps"]:
                self._log(window, grad_norm)
            self.elapsed_seconds += time.monotonic() - started
            started = time.monotonic()
            if not self.stop_requested and self.last_valid_step != self.step:
                self._validate()
            if self.checkpoint_dir is None or not self.checkpoint_path(self.step).exists():
                self.save()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        for cb in self.callbacks:
            cb.on_train_end(self)
        return self.last_valid

    def _update(self, group: list) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor, str]:
        """One optimiser step over ``update_freq`` batches, loss normalised by target tokens.

        Returns (loss sum, NLL sum, target tokens, gradient norm, status): status is "applied",
        "non-finite" (a NaN or infinite loss, or gradient without a loss scaler: not applied) or
        "overflow" (fp16: the loss scaler found inf/NaN gradients, skipped the step and lowered
        its scale). The learning-rate schedule advances only on an applied step, so update n
        always runs at the rate of step n (eq. 3), however many overflows came before it.
        """
        c = self.config
        batches = [collate(self.train_data, idx, c.pad_multiple) for idx in group]
        n_tokens = sum(b.n_target_tokens for b in batches)
        total_tokens = n_tokens
        if self.world_size > 1:
            count = torch.tensor([n_tokens], dtype=torch.float64, device=self.device)
            dist.all_reduce(count)
            total_tokens = int(count.item())
        # DDP averages gradients over ranks; scale so the result is the mean over all tokens.
        norm = self.world_size / max(total_tokens, 1)
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            sync = i == len(batches) - 1 or self.world_size == 1
            no_sync = not sync and hasattr(self.forward_model, "no_sync")
            ctx = self.forward_model.no_sync() if no_sync else contextlib.nullcontext()
            try:
                with ctx:
                    with autocast(self.precision, self.device):
                        logits = self.forward_model(batch.src, batch.tgt_in)
                    out = label_smoothed_cross_entropy(logits, batch.tgt_out, self.pad_id, c.label_smoothing)
                    self.scaler.scale(out.loss * norm).backward()
            except torch.OutOfMemoryError as err:
                rows, width = batch.tgt_in.shape
                raise OutOfMemoryError(
                    f"out of memory on a batch of {rows} sentences x {max(width, batch.src.size(1))} tokens "
                    f"(TrainConfig.max_tokens={c.max_tokens}): lower TrainConfig.max_tokens and raise "
                    "TrainConfig.update_freq to keep the same tokens per update") from err
            loss_sum += out.loss.detach()
            nll_sum += out.nll
        self.scaler.unscale_(self.optimizer)
        max_norm = c.clip_norm if c.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        # With a scaler, inf/NaN gradients are its business (it skips the step); without one they
        # would corrupt Adam's moments, so they count as non-finite.
        finite = bool(torch.isfinite(loss_sum)) and (self.scaler.is_enabled() or bool(torch.isfinite(grad_norm)))
        status = "non-finite"
        if finite:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.scaler.is_enabled() and scaler_skipped(scale, self.scaler.get_scale()):
                status = "overflow"
            else:
                self.scheduler.step()
                status = "applied"
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, nll_sum, n_tokens, grad_norm, status

    def _log(self, window: dict, grad_norm: torch.Tensor) -> None:
        now = time.monotonic()
        tokens = max(window["tokens"], 1)
        nll = float(window["nll"]) / tokens
        metrics = {
            "train/loss": float(window["loss"]) / tokens,
            "train/nll": nll,
            "train/ppl": math.exp(min(nll, 50.0)),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm),
            "train/target_tokens_per_s": window["tokens"] * self.world_size / max(now - window["time"], 1e-9),
            "train/epoch": float(self.epoch),
        }
        if self.scaler.is_enabled():  # fp16: a falling scale means overflowing (skipped) updates
            metrics["train/loss_scale"] = self.scaler.get_scale()
        window.update(loss=torch.zeros((), device=self.device), nll=torch.zeros((), device=self.device),
                      tokens=0, steps=0, time=now)
        if self.rank == 0:
            for cb in self.callbacks:
                cb.on_log(self.step, metrics)

    @torch.no_grad()
    def evaluate_loss(self, data: TokenStore) -> dict[str, float]:
        """Mean label-smoothed loss, NLL and perplexity per target token on ``data``."""
        c = self.config
        self.model.eval()
        sampler = TokenBatchSampler(data.lengths["src"], data.lengths["tgt"], c.max_tokens, shuffle=False,
                                    max_positions=self.model.config.max_positions, pad_multiple=c.pad_multiple)
        loss = nll = 0.0
        tokens = 0
        for idx in sampler.batches(0):
            batch = collate(data, idx, c.pad_multiple).to(self.device)
            with autocast(self.precision, self.device):
                logits = self.model(batch.src, batch.tgt_in)
            out = label_smoothed_cross_entropy(logits, batch.tgt_out, self.pad_id, c.label_smoothing)
            loss += float(out.loss)
            nll += float(out.nll)
            tokens += int(out.n_tokens)
        self.model.train()
        tokens = max(tokens, 1)
        return {"valid/loss": loss / tokens, "valid/nll": nll / tokens, "valid/ppl": math.exp(min(nll / tokens, 50.0))}

    def _validate(self) -> None:
        if self.valid_data is None or self.rank != 0:
            return
        self.last_valid = self.evaluate_loss(self.valid_data)
        self.last_valid_step = self.step
        for cb in self.callbacks:
            cb.on_validate(self.step, self.last_valid)


