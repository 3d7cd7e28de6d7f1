"""Which checkpoint a training resumes from, in one process or under ``torchrun`` (§5).

A training's trajectory is fixed by its fingerprint (``Trainer.fingerprint``); a checkpoint of
another fingerprint is not resumed. Under ``torchrun`` every rank must resume from the same state.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .checkpoint import load_checkpoint
from .checkpoint_files import checkpoint_step
from .errors import CheckpointError


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
