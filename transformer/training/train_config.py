"""Training hyper-parameters (§5) and the errors a training stops with: what a caller needs to
configure a ``Trainer`` without loading the training code itself."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..errors import NonFiniteLossError, OutOfMemoryError  # noqa: F401  (API: a training stops with them)
from ..precision import PRECISIONS


@dataclass(frozen=True)
class TrainConfig:
    """Training hyper-parameters. ``max_tokens`` counts padded tokens per batch per device;
    an update is ``update_freq`` batches (gradient accumulation).

    ``init_from`` ("" = random initialisation) names a model checkpoint (an averaged model or a
    training checkpoint) whose weights a new training starts from: fine-tuning. Only the weights
    are taken; the optimiser (Adam's moments) and the learning-rate schedule (eq. 3) start fresh,
    warm-up included, as in a training from scratch.

    ``cooldown_steps`` (0 = eq. 3 throughout, the paper's) brings the rate of the last
    ``cooldown_steps`` of ``max_steps`` updates linearly down (``schedule.cooldown_factor``).

    Regularizers beyond the paper's (``regularizers``; 0 = off, the paper's training):
    ``weight_decay`` is decoupled from the gradient (AdamW, Loshchilov & Hutter 2019, as fairseq's
    ``--weight-decay``); ``src_word_dropout`` replaces each source piece by ``<unk>`` with that
    probability; ``rdrop_alpha`` weighs R-Drop's symmetric KL between two dropout passes of each batch
    (Liang et al. 2021; it doubles an update's work).
    """

    max_tokens: int = 4096
    update_freq: int = 1
    warmup_steps: int = 4000
    lr_scale: float = 1.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    weight_decay: float = 0.0
    max_steps: int = 0
    cooldown_steps: int = 0
    max_epochs: int = 0
    max_minutes: float = 0.0
    precision: str = "fp32"
    seed: int = 1
    log_every: int = 50
    validate_every: int = 0
    checkpoint_every_steps: int = 1000
    checkpoint_every_minutes: float = 0.0
    keep_checkpoints: int = 5
    pad_multiple: int = 1
    compile: bool = False
    nan_policy: str = "skip"
    device: str = "auto"
    init_from: str = ""
    src_word_dropout: float = 0.0
    rdrop_alpha: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_tokens", "update_freq", "warmup_steps", "log_every", "keep_checkpoints", "pad_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive integer, got {value!r}")
        for name in ("max_steps", "cooldown_steps", "max_epochs", "validate_every", "checkpoint_every_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be a non-negative integer, got {value!r}")
        for name in ("lr_scale", "clip_norm", "weight_decay", "max_minutes", "checkpoint_every_minutes", "rdrop_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"TrainConfig.{name} must be a non-negative number, got {value!r}")
        for name in ("label_smoothing", "src_word_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1), got {value!r}")
        if not (self.max_steps or self.max_epochs or self.max_minutes):
            raise ValueError("TrainConfig.max_steps, TrainConfig.max_epochs and TrainConfig.max_minutes are all 0: "
                             "set a limit")
        if self.cooldown_steps and not 0 < self.cooldown_steps <= self.max_steps:
            raise ValueError(f"TrainConfig.cooldown_steps ({self.cooldown_steps}) must be at most max_steps "
                             f"({self.max_steps}): the cool-down is the last updates of a training of max_steps")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.nan_policy not in ("skip", "stop"):
            raise ValueError(f"TrainConfig.nan_policy must be 'skip' or 'stop', got {self.nan_policy!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"TrainConfig.device must be auto, cpu or cuda, got {self.device!r}")
        if not isinstance(self.init_from, str):
            raise ValueError(f"TrainConfig.init_from must be a path (or \"\" for none), got {self.init_from!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s): {', '.join(unknown)}")
        return cls(**values)


# Fields added after checkpoints were first written: a checkpoint and a fingerprint leave them out while
# they are off, so a training without them writes the bytes it wrote before they existed and resumes
# the checkpoints of then.
OPTIONAL_FIELDS = {"src_word_dropout": 0.0, "rdrop_alpha": 0.0}


def stored_config(config: TrainConfig) -> dict[str, Any]:
    """``config`` as checkpoints and fingerprints hold it: every field, ``OPTIONAL_FIELDS`` only when set;
    with a weight decay, ``decoupled_weight_decay``: it was Adam's coupled L2 before, so a checkpoint of
    then is another training and is not resumed."""
    stored = {f.name: getattr(config, f.name) for f in fields(config)
              if f.name not in OPTIONAL_FIELDS or getattr(config, f.name) != OPTIONAL_FIELDS[f.name]}
    if config.weight_decay > 0:
        stored["decoupled_weight_decay"] = True
    return stored
