"""Which checkpoint a training resumes from, in one process or under ``torchrun`` (§5).

A training's trajectory is fixed by its fingerprint (``training_fingerprint``); a checkpoint of
another fingerprint is not resumed. Under ``torchrun`` every rank must resume from the same state.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoint import load_checkpoint
from ..errors import CheckpointError
from .checkpoint_files import checkpoint_step
from .schedule import rates_agree

# TrainConfig fields that may change between a checkpoint and its resumption. ``init_from`` is a
# path: what counts is the file's content, its sha256 (the fingerprint's "init"), so a moved
# copy of the same file resumes and other bytes at the same path restart.
RESUMABLE_CHANGES = {"max_steps", "cooldown_steps", "max_epochs", "max_minutes", "log_every", "validate_every",
                     "checkpoint_every_steps", "checkpoint_every_minutes", "keep_checkpoints", "device",
                     "compile", "nan_policy", "init_from"}


def training_fingerprint(model_config: dict[str, Any], train_config: dict[str, Any], world_size: int,
                         data: str, tokenizer_sha256: str = "", init_sha256: str = "") -> dict[str, Any]:
    """What fixes the training trajectory: model and training settings, the data (the token
    store's size and content sha256, ``data``; the tokenizer's sha256 when given), and the starting
    weights when fine-tuning (the sha256 of the ``init_from`` file).

    Limits (max_steps, max_epochs, max_minutes), logging and checkpoint intervals are left
    out: raising a limit and resuming gives the same result as training longer from scratch.
    So is the cool-down (``cooldown_steps``, which moves with ``max_steps``): ``settings_changes``
    accepts a checkpoint whose updates had the rates the new settings give them (``schedule.rates_agree``).
    """
    train = {k: v for k, v in train_config.items() if k not in RESUMABLE_CHANGES}
    fingerprint = {"model": model_config, "train": train, "world_size": world_size, "data": data}
    if tokenizer_sha256:
        fingerprint["tokenizer"] = tokenizer_sha256
    if init_sha256:   # absent for random weights: checkpoints from before init_from existed still match
        fingerprint["init"] = init_sha256
    return fingerprint


def settings_changes(state: dict[str, Any], fingerprint: dict[str, Any],
                     train_config: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """What stops checkpoint ``state`` from resuming under ``fingerprint`` and ``train_config``
    (``differences``, and the cool-down's rates), empty when it resumes."""
    changes = differences(state.get("fingerprint", {}), fingerprint)
    # max_steps and cooldown_steps are resumable while the updates already made had the same rates.
    saved = state.get("train_config", {})
    old_cooldown = (saved.get("max_steps", 0), saved.get("cooldown_steps", 0))
    new_cooldown = (train_config["max_steps"], train_config["cooldown_steps"])
    if not rates_agree(state["step"], old_cooldown, new_cooldown):
        changes["train.(max_steps, cooldown_steps)"] = (old_cooldown, new_cooldown)
    return changes


def differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Flattened keys whose values differ between two nested dicts."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def describe(changes: dict[str, tuple[Any, Any]]) -> str:
    """The first few ``differences`` in words: ``train.max_tokens: 48 -> 64; ...``."""
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(changes.items())[:6])


def newest_checkpoint(checkpoints: list[Path], fingerprint: dict[str, Any], rank: int, world_size: int,
                      device: torch.device) -> tuple[str, dict[str, Any] | None]:
    """The checkpoint to resume from, as (its name for messages, its state), or ("", None).

    One process: the newest of ``checkpoints`` (this rank's, oldest first). Under torchrun: the
    newest of every rank's checkpoint folder, read by the rank that holds it and sent to all. Only
    rank 0 writes checkpoints and hosts do not share a disk, so on a rerun the other ranks have none
    (or older ones, from a run where they were rank 0); DDP sends rank 0's weights when it wraps the
    model but not the optimiser, the schedule, the RNG or the position in the data, so a rank that
    started over on its own would train apart from the others without any error. The file's bytes
    travel rather than a loaded state so that every rank loads it alike (weights only, onto its own
    device). The ranks also compare fingerprints first: hosts with other params or token stores
    would train apart just as silently, so that is a ``ValueError`` on every rank.
    """
    if world_size == 1:
        if not checkpoints:
            return "", None
        return str(checkpoints[-1]), load_checkpoint(checkpoints[-1], map_location=device)
    newest = checkpoint_step(checkpoints[-1]) if checkpoints else -1
    ranks: list[Any] = [None] * world_size
    dist.all_gather_object(ranks, (fingerprint, newest, checkpoints[-1].name if checkpoints else ""))
    for other, (theirs, *_) in enumerate(ranks):
        changes = differences(ranks[0][0], theirs)
        if changes:
            raise ValueError(f"rank {other} trains other settings or data than rank 0 ({describe(changes)}): "
                             "every host needs the same params.yaml and token stores")
    steps = [step for _, step, _ in ranks]
    source = steps.index(max(steps))   # the lowest rank among those with the newest step
    if steps[source] < 0:
        return "", None
    payload = [checkpoints[-1].read_bytes() if rank == source else None]
    dist.broadcast_object_list(payload, src=source, device=device)
    name = f"rank {source}'s {ranks[source][2]}"
    try:
        return name, torch.load(io.BytesIO(payload[0]), map_location=device, weights_only=True)
    except Exception as err:  # as load_checkpoint: torch raises several types for a bad file
        raise CheckpointError(f"{name} cannot be loaded: {type(err).__name__}: {err}") from err
