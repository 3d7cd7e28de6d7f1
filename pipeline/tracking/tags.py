"""What a run is tagged and named with: the git commit (and whether the tree was dirty), the data
hashes of ``dvc.lock``, the device, the lengths the model saw in training; and its name,
``<preset>-<dataset>-<pair>-<params hash>@<commit>`` (two runs of the same recipe share the hash)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from pipeline.tracking.sweep_point import sweep_tags
from transformer.training.trainer import Trainer


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
        "torch.version": torch.__version__, **data_hashes(), **sweep_tags(),
    }


def params_hash(params: Mapping[str, Any]) -> str:
    """A short hash of the params: the same recipe gives the same hash, whatever the key order."""
    text = json.dumps({k: param_value(v) for k, v in sorted(params.items())}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def run_name(params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """``<preset>-<dataset>-<pair>-<params hash>@<commit>`` (``+dirty`` when the tree had local
    changes): says what was trained, with what recipe, from which code; MLflow's default is a
    random pair of words."""
    commit = tags.get("git.commit", "unknown")
    code = "nogit" if commit == "unknown" else commit[:7] + ("+dirty" if tags.get("git.dirty") == "true" else "")
    parts = [str(params.get("model.preset", "model")), tags.get("dataset", "data"), tags.get("language_pair", "")]
    return "-".join(p for p in parts if p) + f"-{params_hash(params)}@{code}"


def training_lengths(trainer: Trainer) -> dict[str, str]:
    """Source lengths (in pieces) the model saw in training, as tags: the model card's length limit."""
    try:
        lengths = trainer.train_data.lengths["src"]
        return {"data.train_src_tokens.max": str(int(lengths.max())),
                "data.train_src_tokens.p99": str(int(np.percentile(lengths, 99)))}
    except (AttributeError, KeyError, TypeError, ValueError):   # another kind of data, or none
        return {}


def param_value(value: Any) -> str:
    """A param as MLflow stores it: lists and mappings as JSON, anything else as text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
