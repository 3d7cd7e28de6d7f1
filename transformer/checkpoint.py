"""Checkpoints: atomic saving, safe loading and averaging (§6.1)."""

from __future__ import annotations

import dataclasses
import os
import sys
import zipfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .atomic import atomic_write, file_sha256
from .config import ModelConfig
from .errors import CheckpointError  # noqa: F401  (API: raised here, defined apart for light callers)
from .model import Transformer


def save_checkpoint(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Atomically save a checkpoint made only of tensors, numbers, strings, lists and dicts.

    Its bytes are a function of its values alone (``canonical``): a resumed training writes the
    bytes of an uninterrupted one, and DVC sees the same outputs."""
    checkpoint = canonical(checkpoint)
    atomic_write(path, lambda f: torch.save(checkpoint, f))


def canonical(value: Any) -> Any:
    """``value`` with every string interned (containers rebuilt, tensors as they are).

    Pickle writes a string once per object and refers back to it after: equal strings that are
    one object in a resumed run (the curves' column names, unpickled from the checkpoint) and
    separate objects in an uninterrupted run would give other bytes for the same values.
    """
    if isinstance(value, str):
        return sys.intern(value)
    if type(value) in (dict, OrderedDict):
        out = type(value)((canonical(k), canonical(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):   # a module's state_dict: the versions load_state_dict reads
            out._metadata = canonical(value._metadata)
        return out
    if type(value) in (list, tuple):
        return type(value)(canonical(v) for v in value)
    return value


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``: unpickling never runs code from the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for bad or unsafe files
        hint = "" if zipfile.is_zipfile(path) else " (not the zip archive torch.save writes: is it a checkpoint?)"
        raise CheckpointError(f"checkpoint {path} cannot be loaded safely: {_load_failure(err)}{hint}") from err


def _load_failure(err: Exception) -> str:
    """torch.load's error in one line: for a file that would run code (refused by ``weights_only``)
    the unpickler's reason, without torch's advice to allowlist it; else the first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if "WeightsUnpickler error:" in line:
            reason = line.split("WeightsUnpickler error:", 1)[1].split(" Please use", 1)[0].strip()
            return f"Weights only load failed: {reason} (refused: unpickling it could run code)"
    return f"{type(err).__name__}: {lines[0]}" if lines else f"{type(err).__name__} (empty or truncated file?)"


def model_checkpoint(model: Transformer, **extra: Any) -> dict[str, Any]:
    """A self-describing model checkpoint: its config travels with the weights."""
    return {"model_config": model.config.to_dict(), "model": model.state_dict(), **extra}


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Transformer:
    """Rebuild a ``Transformer`` from a checkpoint written by ``model_checkpoint`` or the Trainer."""
    return model_from_checkpoint(load_checkpoint(path, map_location), str(path)).to(map_location)


def require_model_entries(ckpt: Any, source: str) -> None:
    """A model checkpoint is a dict with ``model_config`` and ``model``; else one ``CheckpointError``."""
    if not isinstance(ckpt, dict) or "model_config" not in ckpt or "model" not in ckpt:
        raise CheckpointError(f"{source} has no model_config/model entries: not a model checkpoint")


def model_from_checkpoint(ckpt: dict[str, Any], source: str = "checkpoint") -> Transformer:
    """Rebuild a ``Transformer`` from an already loaded model checkpoint."""
    require_model_entries(ckpt, source)
    model = Transformer(ModelConfig.from_dict(ckpt["model_config"]))
    load_state(model, ckpt["model"], source=source)
    return model


def load_state(model: Transformer, state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Load weights, naming the first mismatching tensor instead of PyTorch's long report."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, tensor in state.items():
        if tensor.shape != own[name].shape:
            raise CheckpointError(
                f"{source} does not fit this model: {name} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(own[name].shape)}")
    model.load_state_dict(state)


def tied_names(config: ModelConfig) -> dict[str, str]:
    """Each key of the state dict of a ``Transformer`` of ``config`` mapped to the first key of the
    same parameter: §3.4 ties the pre-softmax projection to the target embedding (and, with
    ``share_embeddings``, to the source embedding). The names and ties do not depend on the widths, so
    the model is built two features a head wide: a few MB at any vocabulary (the meta device would
    allocate nothing, but its initialisers import torch._dynamo, 1.4 s of every average stage)."""
    narrow = dataclasses.replace(config, d_model=2 * config.n_heads, d_ff=2)
    state = Transformer(narrow).state_dict(keep_vars=True)
    first: dict[int, str] = {}
    return {name: first.setdefault(id(tensor), name) for name, tensor in state.items()}


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, Any]:
    """Checkpoint averaging (§6.1): the element-wise mean of the models of ``paths``
    (the paper averages the last 5 checkpoints for base models, the last 20 for big ones).

    Returns a model checkpoint: ``model_config``, the averaged ``model`` state and ``averaged_from``
    (the paths). Nothing else: the same checkpoints always give the same bytes. Tied weights
    (``tied_names``) are averaged once and are one tensor under all their keys, as in a training
    checkpoint: ``torch.save`` then stores the matrix once and ``torch.load`` gives back one storage
    under every key. Files that hold equal copies instead (averaged models written before) are
    averaged alike, their copies checked equal.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    config = None
    tied: dict[str, str] = {}
    for path in paths:
        ckpt = load_checkpoint(path)
        require_model_entries(ckpt, str(path))
        if config is None:
            config = ckpt["model_config"]
            tied = tied_names(ModelConfig.from_dict(config))
        elif ckpt["model_config"] != config:
            differ = describe_differences(config_differences(ckpt["model_config"], ModelConfig.from_dict(config)))
            raise CheckpointError(f"{path} has a different model config from {paths[0]}: {differ}")
        state = ckpt["model"]
        for name, tensor in state.items():
            owner = tied.get(name, name)
            if owner != name and owner in state:
                if not _same_values(tensor, state[owner]):
                    raise CheckpointError(f"{path}: {name} differs from {owner}, which §3.4 ties it to")
                continue   # one matrix, added once
            if name in total:
                total[name] += tensor.double()
            else:
                total[name], dtypes[name] = tensor.double().clone(), tensor.dtype
    averaged: dict[str, torch.Tensor] = {}
    for name in state:   # the last file's keys, in its order (the config, hence the keys, are the same)
        owner = tied.get(name, name)
        averaged[name] = averaged[owner] if owner in averaged else (total[name] / len(paths)).to(dtypes[name])
    return {"model_config": config, "model": averaged, "averaged_from": [str(p) for p in paths]}


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values: at once when they are one view of one storage."""
    if (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.storage_offset() == b.storage_offset()
            and a.shape == b.shape and a.stride() == b.stride()):
        return True
    return a.shape == b.shape and torch.equal(a, b)


def config_differences(checkpoint_config: dict[str, Any], config: ModelConfig) -> dict[str, tuple[Any, Any]]:
    """Model config fields whose value in a checkpoint differs from ``config``'s:
    ``{field: (checkpoint's value, config's value)}``. A checkpoint written before a field existed
    counts with that field's default (``ModelConfig.from_dict`` fills it in)."""
    try:
        stored = ModelConfig.from_dict(checkpoint_config).to_dict()
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"the checkpoint's model config is not usable: {err}") from None
    own = config.to_dict()
    return {name: (stored.get(name), own[name]) for name in own if stored.get(name) != own[name]}


def describe_differences(differences: dict[str, tuple[Any, Any]], other: str = "vs") -> str:
    """``config_differences`` in words: ``d_ff 48 (vs 64), ...``."""
    return ", ".join(f"{name} {old!r} ({other} {new!r})" for name, (old, new) in differences.items())


def init_weights(model: Transformer, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> str:
    """Copy the weights of the model checkpoint ``path`` into ``model`` (the start of a fine-tuning);
    returns the sha256 of the file's bytes, the identity of the starting point.

    Only the weights are taken: an averaged model (§6.1) has no optimiser or schedule state, and a
    training checkpoint's (and any tracking run id it carries) belong to another training. The
    checkpoint's model config must equal ``model.config``: a ``CheckpointError`` names every field
    that differs (a different ``vocab_size`` means another tokenizer, whose ids the weights do not
    index).
    """
    ckpt = load_checkpoint(path, map_location)
    require_model_entries(ckpt, str(path))
    differences = config_differences(ckpt["model_config"], model.config)
    if differences:
        described = describe_differences(differences, "this model:")
        hint = ("; another vocab_size means another tokenizer: use the one these weights were trained with"
                if "vocab_size" in differences else "")
        raise CheckpointError(f"{path} was trained with another model config: {described}{hint}")
    load_state(model, ckpt["model"], str(path))
    return file_sha256(path)
