"""Training loop (§5): token-count batches, Adam with warm-up, label smoothing, checkpoints.

The Trainer knows nothing of trackers: the pipeline observes it through ``TrainerCallback``.
It runs on CUDA when present, else CPU, and under ``torchrun`` (DDP) without change.
Resume is exact: model, optimiser, schedule, RNG states (every rank's: ``rng_states``), the position
in the data and the open log window are in the checkpoint; the data order is a pure function of (seed, epoch).
A training stopped early (a signal, or the clock before its length) resumes to the outputs of an
uninterrupted one, byte for byte: see ``Trainer.train`` for the rule.
Fine-tuning: ``TrainConfig.init_from`` starts a new training from another model's weights.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint import init_weights, load_state, save_checkpoint
from ..errors import CheckpointError, NonFiniteLossError, OutOfMemoryError  # noqa: F401  (API)
from ..model import Transformer
from ..precision import autocast, check_precision, default_device, resolve_precision
from ..tokens import EOS_ID
from . import rng_states
from .batching import Batch, DataPosition, TokenBatchSampler, collate, update_positions
from .callback import TrainerCallback
from .checkpoint_files import checkpoint_name, list_checkpoints, prune, remove_unfinished_writes
from .evaluation import evaluate_loss
from .loss import LossOutput, projected_label_smoothed_cross_entropy
from .prefetch import Prefetcher
from .regularizers import drop_source_pieces, projected_rdrop_loss
from .resume import describe, newest_checkpoint, settings_changes, training_fingerprint
from .schedule import make_optimizer, make_scheduler
from .stopping import StopVote, agree, rank_and_world_size, stop_signals
from .token_store import TokenStore
from .train_config import TrainConfig, stored_config
from .train_log import LogWindow
from .update_ledger import UpdateLedger


class Trainer:
    """Trains a ``Transformer`` on a ``TokenStore`` (§5)."""

    def __init__(self, model: Transformer, config: TrainConfig, train_data: TokenStore, *,
                 valid_data: TokenStore | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 callbacks: list[TrainerCallback] | None = None, tokenizer_sha256: str = "",
                 prefetch: int | None = None) -> None:
        """``tokenizer_sha256``: the identity of the tokenizer that made ``train_data`` (its model
        file's sha256), part of the fingerprint: the same ids from another vocabulary are other data.
        ``prefetch``: updates whose batches a background thread collates (and pins) ahead, 0: in
        the loop; the same batches in the same order either way, so it changes speed, never outputs.
        None: 2 on CUDA (the copies to the GPU become asynchronous), 0 on a CPU, where the thread
        cost 3-6% of the step (bench/train_step.py, docs/benchmarks.md)."""
        self.config = config
        self.device = default_device() if config.device == "auto" else torch.device(config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("TrainConfig.device is cuda but no GPU is visible")
        check_precision(config.precision, self.device)
        self.precision = resolve_precision(config.precision, self.device)
        self.rank, self.world_size = rank_and_world_size()
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
        self.prefetch = (2 if self.device.type == "cuda" else 0) if prefetch is None else prefetch
        self.pad_id = model.config.pad_id
        self.train_data, self.valid_data = train_data, valid_data
        # Read once (a WMT store is ~1 GB); every checkpoint carries it.
        self.data_sha256 = train_data.content_sha256()
        self.tokenizer_sha256 = tokenizer_sha256
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.callbacks = callbacks or []
        self.optimizer = make_optimizer(model.parameters(), weight_decay=config.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, model.config.d_model, config.warmup_steps, config.lr_scale,
                                        config.max_steps, config.cooldown_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16" and self.device.type == "cuda")
        self.sampler = TokenBatchSampler(
            train_data.lengths["src"], train_data.lengths["tgt"], config.max_tokens, seed=config.seed,
            rank=self.rank, world_size=self.world_size, max_positions=model.config.max_positions,
            pad_multiple=config.pad_multiple)
        self.sampler.require_updates(config.update_freq, epoch=0)   # before any work: else it never ends
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
        # A SIGTERM/SIGINT reached this process (set by the handler; once a stop is agreed, on every rank).
        self.stop_requested = False
        self.stop_agreed = StopVote()   # the ranks' votes summed in the last update's all-reduce
        self.checkpoint_agreed = False  # ... and whether a rank's clock called for a checkpoint
        self.stopped_early = False      # train() ended at a resume point, not at the training's length
        self.stopped_by = StopVote()    # why it stopped early (any rank's signal, the clock), once agreed
        self.stop_signal = 0            # the signal this process received (0: none, or another rank's)
        self.window = LogWindow(self.device)
        self.last_valid: dict[str, float] = {}
        self.last_valid_step = -1
        self.resumed_from = ""   # the checkpoint resume() loaded, for messages
        self.skipped_updates = 0  # updates with a non-finite loss skipped by this process (nan_policy skip)
        self.ledger = UpdateLedger(self.device, 0, self._rate_of_update)
        self.next_read_step = 0   # the step at which the loop reads the ledger next (``_read_ledger``)

    # ----------------------------------------------------------------- state
    def state_dict(self, rng_ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The checkpoint's content; ``rng_ranks``: every rank's RNG states (``rng_states.gather``,
        several processes only), which ``load_state_dict`` gives back to each rank."""
        extra: dict[str, Any] = {}
        for cb in self.callbacks:
            extra.update(cb.checkpoint_state())
        return {
            "model_config": self.model.config.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train_config": stored_config(self.config),
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            # Wall time is kept only where it decides something (a ``max_minutes`` budget): a run
            # limited by updates or epochs writes the same checkpoint bytes on every machine.
            "elapsed_seconds": self.elapsed_seconds if self.config.max_minutes else 0.0,
            "last_valid": self.last_valid, "last_valid_step": self.last_valid_step,
            # The open log window, only when there is one: a checkpoint on the log grid is unchanged.
            **({"log_window": window} if (window := self.window.state_dict()) is not None else {}),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            **({"rng_ranks": rng_ranks} if rng_ranks else {}),   # absent for one process: its bytes as before
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
        self.window.load_state_dict(state.get("log_window"))
        rng_states.restore(state, self.rank, self.world_size)   # this rank's own, when saved per rank

    def fingerprint(self) -> dict[str, Any]:
        """What fixes the training trajectory (``resume.training_fingerprint``): model and training
        settings, the token store's content, the tokenizer's and the ``init_from`` file's sha256."""
        return training_fingerprint(self.model.config.to_dict(), stored_config(self.config), self.world_size,
                                    f"{len(self.train_data)}:{self.data_sha256}", self.tokenizer_sha256,
                                    self.init_sha256)

    def resume(self, on_change: str = "error") -> dict[str, Any] | None:
        """Load the newest checkpoint of ``checkpoint_dir``, if any; returns its callback state.

        When that checkpoint was made with another model, settings or data (see
        ``fingerprint``), ``on_change="error"`` raises ``ValueError`` naming the differences and
        ``on_change="restart"`` deletes the old checkpoints and returns None (a fresh start).
        Under torchrun every rank resumes from the same checkpoint (``resume.newest_checkpoint``), and a
        rank whose settings or data differ from rank 0's raises ``ValueError`` on every rank.
        """
        if self.checkpoint_dir is None:
            return None
        if self.rank == 0:
            remove_unfinished_writes(self.checkpoint_dir)
        checkpoints = list_checkpoints(self.checkpoint_dir, resume_points=True)
        source, state = newest_checkpoint(checkpoints, self.fingerprint(), self.rank, self.world_size, self.device)
        if state is None:
            return None
        changes = settings_changes(state, self.fingerprint(), asdict(self.config))
        if changes:
            described = describe(changes)
            if on_change != "restart":
                raise ValueError(f"{source} was trained with other settings ({described}); "
                                 f"delete {self.checkpoint_dir} to start over")
            changed = [what for key, what in (("data", "the training data"), ("tokenizer", "the tokenizer"))
                       if key in changes] or ["settings"]
            print(f"{' and '.join(changed)} changed since {source} ({described}): starting a new training",
                  flush=True)
            for old in checkpoints:   # every rank decides alike (same state): each clears its own folder
                old.unlink(missing_ok=True)   # missing: another rank sharing the folder came first
            return None
        self.load_state_dict(state, source)
        self.resumed_from = source
        return state.get("callbacks", {})

    def checkpoint_path(self, step: int, resume_point: bool = False) -> Path:
        assert self.checkpoint_dir is not None
        return self.checkpoint_dir / checkpoint_name(step, resume_point)

    def save(self, resume_point: bool = False, unless_saved: bool = False) -> Path | None:
        """Write checkpoint_<step>.pt atomically (rank 0 only) and keep the newest K; or, with
        ``resume_point``, the resume point checkpoint_<step>.resume.pt (``checkpoint_files``), which
        is neither counted nor pruned among the K. Either replaces any older resume point.
        ``unless_saved``: nothing when rank 0 already holds checkpoint_<step>.pt (the same state).

        Under torch.distributed every rank calls it at the same update: the ranks' RNG states are
        gathered into rank 0's checkpoint (``rng_states``), so its decisions are made after that."""
        rng_ranks = rng_states.gather(self.world_size)
        if self.checkpoint_dir is None or self.rank != 0:
            return None
        if unless_saved and self.checkpoint_path(self.step).exists():
            return None
        path = self.checkpoint_path(self.step, resume_point)
        save_checkpoint(path, self.state_dict(rng_ranks))
        prune(self.checkpoint_dir, path, 0 if resume_point else self.config.keep_checkpoints)
        for cb in self.callbacks:
            cb.on_checkpoint(self.step, path)
        return path

    # -------------------------------------------------------------- training
    def _at_length(self) -> bool:
        """The training's length is reached: ``max_steps`` updates or ``max_epochs`` epochs."""
        c = self.config
        return bool((c.max_steps and self.step >= c.max_steps) or (c.max_epochs and self.epoch >= c.max_epochs))

    def _stop_vote(self, started: float) -> StopVote:
        """This rank's wish to stop: a signal came, or the ``max_minutes`` budget is spent."""
        budget = self.config.max_minutes
        elapsed = self.elapsed_seconds + time.monotonic() - started
        return StopVote(signal=self.stop_requested, clock=bool(budget and elapsed >= 60 * budget))

    def _checkpoint_due(self, last_checkpoint: float) -> bool:
        minutes = self.config.checkpoint_every_minutes
        return bool(minutes and time.monotonic() - last_checkpoint >= 60 * minutes)

    def _collate(self, position: DataPosition) -> list[Batch] | None:
        """An update's batches, built off the training thread; pinned on CUDA (asynchronous copies)."""
        if position.group is None:
            return None
        batches = [collate(self.train_data, idx, self.config.pad_multiple) for idx in position.group]
        return [b.pin_memory() for b in batches] if self.device.type == "cuda" else batches

    def _request_stop(self, signum: int, frame: Any) -> None:
        self.stop_requested = True
        self.stop_signal = signum

    def train(self) -> dict[str, float]:
        """Train until the training's length or an agreed stop (§5); returns the last validation
        metrics (if any) and ``train/skipped_pairs`` (pairs too long to batch, never trained on).

        How a training ends, the rule that gives a preempted and resumed training the outputs of
        an uninterrupted one (curves, kept and averaged checkpoints, model: byte for byte):

        - At its length (``max_steps`` or ``max_epochs`` reached, or ``max_minutes`` when it is the
          only limit): the open log window is logged, the model validated, and the checkpoint
          ``checkpoint_<step>.pt`` written, kept and averaged like those of the grid.
        - Stopped early (SIGTERM or SIGINT on any rank, or the ``max_minutes`` clock on any rank
          before the training's length): the ranks agree on it in the update's all-reduce
          (``stopping``) and all stop after the same update; nothing is logged or validated, and
          rank 0 writes the resume point ``checkpoint_<step>.resume.pt`` (``checkpoint_files``),
          never kept or averaged, replaced by the next checkpoint. It carries the open log window,
          so the resumed run logs the point an uninterrupted one logs. ``stopped_early`` and
          ``stop_requested`` are then set on every rank, and the caller ends normally (exit 0).

        A kill (SIGKILL) resumes from the newest checkpoint alike. Only a ``max_minutes`` budget
        puts wall time (``elapsed_seconds``) into the checkpoints' bytes.
        """
        c = self.config
        if self.rank == 0 and self.sampler.skipped:
            print(f"{self.sampler.skipped:,} of {len(self.train_data):,} training pairs skipped: longer than "
                  f"TrainConfig.max_tokens={c.max_tokens} tokens or the model's max_positions="
                  f"{self.model.config.max_positions} (with EOS)", flush=True)
        for cb in self.callbacks:
            cb.on_train_start(self)
        started = last_ckpt_time = time.monotonic()
        self.window.restart_clock()
        self.ledger = UpdateLedger(self.device, self.step, self._rate_of_update)
        self._read_ledger()
        handled = self.step   # the last step whose log, validation and checkpoint are done
        self.model.train()
        positions = update_positions(self.sampler, c.update_freq, self.epoch, self.batch_in_epoch)
        updates = Prefetcher(positions, self._collate, self.prefetch)
        with stop_signals(self._request_stop), updates:
            # Agreed once before the first update as well: a budget already spent stops every rank.
            _, self.stop_agreed, _ = agree(0, self._stop_vote(started), self.world_size, self.device)
            while True:
                stop = self._stop_vote(started) if self.world_size == 1 else self.stop_agreed
                if stop or self._at_length():
                    self._read_ledger()   # self.step counted skipped updates too until now
                    if stop or self._at_length():
                        break
                position, batches = next(updates)
                self.epoch, self.batch_in_epoch = position.epoch, position.batch_in_epoch
                if batches is None:  # end of an epoch; already validated when resuming at its checkpoint
                    if c.validate_every == 0 and self.valid_data is not None:
                        self._read_ledger()
                        if self.last_valid_step != self.step:
                            self._validate()
                    continue
                self._update(batches, self._stop_vote(started), self._checkpoint_due(last_ckpt_time))
                # The step this update makes if it was applied; the ledger's read corrects it where
                # updates were skipped (nothing applied: neither the step count nor the schedule moves).
                self.step += 1
                # Several ranks: as agreed before the update (every rank takes part in a save).
                due_minutes = (self._checkpoint_due(last_ckpt_time) if self.world_size == 1
                               else self.checkpoint_agreed)
                if not (due_minutes or self.step == self.next_read_step):
                    continue
                self._read_ledger()
                if self.step > handled:
                    handled = self.step
                    if self.step % c.log_every == 0:
                        self._log()
                    if c.validate_every and self.step % c.validate_every == 0:
                        self._validate()
                    due_minutes = due_minutes or bool(c.checkpoint_every_steps
                                                      and self.step % c.checkpoint_every_steps == 0)
                if due_minutes:
                    self.elapsed_seconds += time.monotonic() - started
                    started = time.monotonic()
                    self.save()
                    last_ckpt_time = time.monotonic()
            self.elapsed_seconds += time.monotonic() - started
            at_length = self._at_length() or bool(stop.clock and not (c.max_steps or c.max_epochs))
            self.stopped_early = not at_length
            self.stopped_by = StopVote() if at_length else stop
            if at_length:
                if self.window.steps:
                    self._log()
                if self.last_valid_step != self.step:
                    self._validate()
                self.save(unless_saved=True)
            else:
                self.stop_requested = True   # on the ranks that only agreed too: callbacks read it
                self.save(resume_point=True, unless_saved=True)   # a checkpoint of this step holds this state
        for cb in self.callbacks:
            cb.on_train_end(self)
        return {**self.last_valid, "train/skipped_pairs": float(self.sampler.skipped)}

    def _rate_of_update(self, n: int) -> float:
        """Eq. 3's rate of update ``n`` (from 1), as the scheduler gives it (one rate for all groups)."""
        return self.scheduler.base_lrs[0] * self.scheduler.lr_lambdas[0](n - 1)

    def _next_grid_step(self, step: int) -> int:
        """The first step after ``step`` that logs, validates, checkpoints or ends the training."""
        c = self.config
        candidates = [(step // every + 1) * every
                      for every in (c.log_every, c.validate_every, c.checkpoint_every_steps) if every]
        if c.max_steps > step:
            candidates.append(c.max_steps)
        return min(candidates)

    def _read_ledger(self) -> None:
        """Read the device's ledger (one copy): the exact step, the schedule brought to it, the
        window's applied updates counted, the non-finite updates reported (``nan_policy``)."""
        reading = self.ledger.read()
        if reading.non_finite:
            if self.config.nan_policy == "stop":
                raise NonFiniteLossError(f"non-finite loss at step {reading.first_non_finite_step}; "
                                         "the last good checkpoint is kept")
            self.skipped_updates += reading.non_finite
            if self.rank == 0:
                print(f"{reading.non_finite} update(s) with a non-finite loss skipped since step "
                      f"{reading.first_non_finite_step - 1} (nan_policy skip)", flush=True)
        self.window.count_applied(reading.applied - self.ledger.base)
        self.step = reading.applied
        while self.scheduler.last_epoch < self.step:
            self.scheduler.step()
        # Updates until then can reach no further than that step, so its rates are all they need.
        self.next_read_step = self._next_grid_step(self.step)
        self.ledger.plan(self.step, self.next_read_step - self.step)

    def _update(self, batches: list[Batch], vote: StopVote, checkpoint_due: bool = False) -> None:
        """One optimiser step over an update's ``update_freq`` batches, loss normalised by target tokens.

        ``vote`` (this rank's wish to stop) and ``checkpoint_due`` (its clock's) are summed over
        ranks with the token count, in the one all-reduce the update needs anyway; the results are
        ``stop_agreed`` and ``checkpoint_agreed``, the same on every rank.
        An update is skipped on the device (``update_ledger``) when its loss is NaN or infinite
        (non-finite), or its gradient is: without a loss scaler that is non-finite too, with one
        (fp16) it is an overflow, the scaler's normal search for its scale, after which it lowers
        the scale. The learning-rate schedule advances only with applied updates, so update n
        always runs at the rate of step n (eq. 3), however many were skipped before it.
        With one process nothing is read back from the device here.
        """
        c = self.config
        n_tokens = sum(b.n_target_tokens for b in batches)
        total_tokens, self.stop_agreed, self.checkpoint_agreed = agree(
            n_tokens, vote, self.world_size, self.device, checkpoint_due)
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
                        out = self._batch_loss(batch)
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
        loss_bad = ~torch.isfinite(loss_sum)
        grad_bad = ~torch.isfinite(grad_norm)
        skipped = loss_bad | grad_bad
        # With a scaler, inf/NaN gradients are its business (an overflow); without one they would
        # corrupt Adam's moments, so they count as non-finite.
        non_finite = loss_bad if self.scaler.is_enabled() else skipped
        self._step_optimizer(skipped)
        self.scaler.update()   # lowers the scale where it found inf/NaN gradients (fp16 only)
        applied = self.ledger.record(skipped, non_finite, grad_norm)
        self.window.add(loss_sum, nll_sum, n_tokens, applied)
        self.optimizer.zero_grad(set_to_none=True)

    def _batch_loss(self, batch: Batch) -> LossOutput:
        """A training batch's summed loss (§5.4): the fused projection and label-smoothed loss, with
        the regularizers ``TrainConfig`` turns on (``regularizers``)."""
        c = self.config
        src = drop_source_pieces(batch.src, c.src_word_dropout, self.pad_id, EOS_ID)
        if c.rdrop_alpha > 0:   # the batch twice in one forward: each copy gets its own dropout masks
            hidden = self.forward_model(torch.cat([src, src]), torch.cat([batch.tgt_in, batch.tgt_in]),
                                        project=False)
            return projected_rdrop_loss(hidden, self.model.output.weight, batch.tgt_out, self.pad_id,
                                        c.label_smoothing, c.rdrop_alpha, n_tokens=batch.n_target_tokens)
        hidden = self.forward_model(src, batch.tgt_in, project=False)
        return projected_label_smoothed_cross_entropy(hidden, self.model.output.weight, batch.tgt_out, self.pad_id,
                                                      c.label_smoothing, n_tokens=batch.n_target_tokens)

    def _step_optimizer(self, skipped: torch.Tensor) -> None:
        """Adam's step at the ledger's rate, left undone on the device where ``skipped``.

        The Trainer's Adam is fused (``make_optimizer``: CPU and CUDA, its only devices), and the
        fused kernel takes the skip as ``found_inf`` (as from ``GradScaler.step``): parameters
        and moments stay, and its step count is taken back. The rate goes in as a device tensor for
        the step only: the param groups keep the scheduler's floats, so checkpoints are as before.
        """
        groups = self.optimizer.param_groups
        host_rates = [group["lr"] for group in groups]
        rate = self.ledger.next_rate()
        for group in groups:
            group["lr"] = rate
        self.optimizer.grad_scale, self.optimizer.found_inf = None, skipped.to(torch.float32)
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.grad_scale, self.optimizer.found_inf
            for group, host_rate in zip(groups, host_rates):
                group["lr"] = host_rate

    def _log(self) -> None:
        """One point of the training curve from the window, which then starts over (after a ledger read)."""
        w = self.window
        tokens = max(int(w.tokens), 1)
        nll = float(w.nll) / tokens
        metrics = {
            "train/loss": float(w.loss) / tokens,
            "train/nll": nll,
            "train/ppl": math.exp(min(nll, 50.0)),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": float(self.ledger.grad_norm),
            "train/target_tokens_per_s": w.tokens_per_s() * self.world_size,
            "train/epoch": float(self.epoch),
        }
        if self.scaler.is_enabled():  # fp16: a falling scale means overflowing (skipped) updates
            metrics["train/loss_scale"] = self.scaler.get_scale()
        w.reset()
        if self.rank == 0:
            for cb in self.callbacks:
                cb.on_log(self.step, metrics)

    def evaluate_loss(self, data: TokenStore) -> dict[str, float]:
        """Mean label-smoothed loss, NLL and perplexity per target token on ``data`` (``evaluation``)."""
        return evaluate_loss(self.model, data, self.config, self.precision, self.device)

    def _validate(self) -> None:
        if self.valid_data is None or self.rank != 0:
            return
        self.last_valid = self.evaluate_loss(self.valid_data)
        self.last_valid_step = self.step
        for cb in self.callbacks:
            cb.on_validate(self.step, self.last_valid)


