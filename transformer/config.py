"""Model configuration: one typed, validated dataclass and the named presets.

The ``base`` and ``big`` presets are Table 3 of Vaswani et al. (2017) exactly; ``tiny`` is
for tests, ``small`` and ``laptop`` (the default recipe's model) for training on a laptop CPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

# The variants by name, as plain data: validating a config loads no layer code (the pipeline's params
# check and the stages that only read a config do not depend on the model's files). The layer
# modules map each name to its code: ``layers.ACTIVATIONS`` (the paper's ReLU, §3.3, and GELU) and
# ``positional.POSITIONAL`` (the paper's sinusoids, §3.5, and learned positions); a test checks that
# those tables have exactly these names.
ACTIVATION_NAMES = ("relu", "gelu")
POSITIONAL_NAMES = ("sinusoidal", "learned")


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the encoder-decoder Transformer (§3, Table 3).

    ``norm_first=False`` is the paper's post-LN residual ``LayerNorm(x + Sublayer(x))``;
    ``True`` is the pre-LN variant (a departure from the paper, more stable for deep
    stacks). ``activation="gelu"`` and ``positional="learned"`` are departures too.
    ``share_embeddings`` ties source embedding, target embedding and the pre-softmax
    projection into one matrix (§3.4), which needs a joint vocabulary.
    """

    vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    norm_first: bool = False
    share_embeddings: bool = True
    positional: str = "sinusoidal"
    max_positions: int = 1024
    pad_id: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers",
                     "n_decoder_layers", "max_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"ModelConfig.{name} must be a positive integer, got {value!r}", name)
        if self.d_model % self.n_heads:
            raise ConfigError(f"ModelConfig.d_model ({self.d_model}) must be divisible by ModelConfig.n_heads "
                              f"({self.n_heads})", "d_model", "n_heads")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ConfigError(f"ModelConfig.{name} must be a number in [0, 1), got {value!r}", name)
        for name, table in (("activation", ACTIVATION_NAMES), ("positional", POSITIONAL_NAMES)):
            if getattr(self, name) not in table:
                raise ConfigError(f"ModelConfig.{name} must be one of {tuple(table)}, got {getattr(self, name)!r}",
                                  name)
        for name in ("norm_first", "share_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"ModelConfig.{name} must be True or False, got {getattr(self, name)!r}", name)
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"ModelConfig.pad_id must be in [0, ModelConfig.vocab_size = {self.vocab_size}), "
                              f"got {self.pad_id!r}", "pad_id")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s): {', '.join(unknown)}", *unknown)
        return cls(**values)


# Presets leave out vocab_size: it comes from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    # Unit tests: runs in milliseconds.
    "tiny": dict(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                 dropout=0.0, max_positions=256),
    # Multi30k on a laptop CPU: the paper's shape at a quarter of base's width and half its depth.
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3,
                  dropout=0.1, max_positions=256),
    # The default recipe's model (params.yaml): small with a 2 x d_model feed-forward layer, which
    # trains ~20% faster per update on 2 CPU cores and scored best on Multi30k's validation set
    # for a ~15-minute budget (docs/results.md, "Sweeps"); P_drop 0.2 ends that budget 0.35 lower in
    # validation perplexity than 0.1 (0.3 trails throughout).
    "laptop": dict(d_model=256, n_heads=4, d_ff=512, n_encoder_layers=3, n_decoder_layers=3,
                   dropout=0.2, max_positions=256),
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1.
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
                 dropout=0.1),
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3.
    "big": dict(d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=6, n_decoder_layers=6,
                dropout=0.3),
}


def build_config(preset: str, vocab_size: int, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` from a named preset, the vocabulary size and field overrides."""
    if preset not in PRESETS:
        raise ConfigError(f"preset {preset!r} does not exist; choose one of {sorted(PRESETS)}", "preset")
    values: dict[str, Any] = {**PRESETS[preset], **overrides, "vocab_size": vocab_size}
    return ModelConfig.from_dict(values)
