"""``params.yaml`` read into typed, validated config objects: the one source of configuration.

Every section maps onto a dataclass. Unknown keys, wrong types and bad values raise
``ParamsError`` with one line naming the key, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml

from transformer.config import PRESETS, ConfigError, ModelConfig, build_config
from transformer.trainer import TrainConfig

PARAMS_FILE = Path(os.environ.get("PARAMS_FILE", "params.yaml"))
T = TypeVar("T")


class ParamsError(ValueError):
    """A value in params.yaml is missing, unknown or invalid; the message names the key."""


@dataclass(frozen=True)
class DataParams:
    dataset: str = "multi30k"
    src_lang: str = "en"
    tgt_lang: str = "de"
    mirror: str = ""
    valid_set: str = "val"
    test_sets: list[str] = field(default_factory=lambda: ["test_2016_flickr"])
    max_words: int = 250
    max_ratio: float = 9.0
    limit_train_pairs: int = 0

    def __post_init__(self) -> None:
        if self.max_words < 1:
            raise ValueError(f"data.max_words must be positive, got {self.max_words}")
        if self.max_ratio < 1:
            raise ValueError(f"data.max_ratio must be at least 1, got {self.max_ratio}")
        if self.limit_train_pairs < 0:
            raise ValueError(f"data.limit_train_pairs must be >= 0, got {self.limit_train_pairs}")
        if not self.test_sets:
            raise ValueError("data.test_sets must name at least one test set")
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        from pipeline.datasets import check_data_params  # the registry knows what exists
        check_data_params(self)

    @property
    def pair(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"

    def resolved_mirror(self) -> str:
        """``DATA_MIRROR`` from the environment, else ``data.mirror`` ("" = upstream)."""
        return os.environ.get("DATA_MIRROR", "") or self.mirror


@dataclass(frozen=True)
class TokenizerParams:
    vocab_size: int = 8000
    model_type: str = "bpe"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000
    seed: int = 1

    def __post_init__(self) -> None:
        if self.vocab_size < 16:
            raise ValueError(f"tokenizer.vocab_size must be at least 16, got {self.vocab_size}")
        if self.model_type not in ("bpe", "unigram"):
            raise ValueError(f"tokenizer.model_type must be bpe or unigram, got {self.model_type!r}")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise ValueError(f"tokenizer.character_coverage must be in [0.9, 1], got {self.character_coverage}")
        if self.input_sentence_size < 1:
            raise ValueError(f"tokenizer.input_sentence_size must be positive, got {self.input_sentence_size}")


@dataclass(frozen=True)
class ModelParams:
    """A preset name plus overrides of any ``ModelConfig`` field (vocab_size comes from the tokenizer)."""

    preset: str = "small"
    overrides: dict[str, Any] = field(default_factory=dict)

    def config(self, vocab_size: int) -> ModelConfig:
        try:
            return build_config(self.preset, vocab_size, **self.overrides)
        except ConfigError as err:
            raise ParamsError(f"params.yaml: {err}") from None


@dataclass(frozen=True)
class AverageParams:
    last_n: int = 5

    def __post_init__(self) -> None:
        if self.last_n < 1:
            raise ValueError(f"average.last_n must be positive, got {self.last_n}")


@dataclass(frozen=True)
class EvaluateParams:
    beam_size: int = 4
    alpha: float = 0.6
    max_len_b: int = 50
    batch_sentences: int = 64
    attention_sentences: int = 3

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"evaluate.beam_size must be positive, got {self.beam_size}")
        if self.alpha < 0:
            raise ValueError(f"evaluate.alpha must be >= 0, got {self.alpha}")
        if self.max_len_b < 1:
            raise ValueError(f"evaluate.max_len_b must be positive, got {self.max_len_b}")
        if self.batch_sentences < 1:
            raise ValueError(f"evaluate.batch_sentences must be positive, got {self.batch_sentences}")
        if self.attention_sentences < 0:
            raise ValueError(f"evaluate.attention_sentences must be >= 0, got {self.attention_sentences}")


@dataclass(frozen=True)
class TrackingParams:
    experiment: str = "transformer"
    registered_model: str = "transformer"

    def __post_init__(self) -> None:
        if not self.experiment.strip():
            raise ValueError("tracking.experiment must not be empty")
        if not self.registered_model.strip():
            raise ValueError("tracking.registered_model must not be empty")


@dataclass(frozen=True)
class Params:
    data: DataParams
    tokenizer: TokenizerParams
    model: ModelParams
    train: TrainConfig
    average: AverageParams
    evaluate: EvaluateParams
    tracking: TrackingParams
    raw: dict[str, Any]

    def flat(self) -> dict[str, Any]:
        """Every key as a dotted name, for tracking (``train.max_tokens`` -> 4096)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = value
        walk("", self.raw)
        return out


SECTIONS: dict[str, type] = {
    "data": DataParams, "tokenizer": TokenizerParams, "model": ModelParams, "train": TrainConfig,
    "average": AverageParams, "evaluate": EvaluateParams, "tracking": TrackingParams,
}


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are expected."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (list,):
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ParamsError(f"params.yaml: {key} must be a list, got {value!r}")
        return [_check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"params.yaml: {key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"params.yaml: {key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"params.yaml: {key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"params.yaml: {key} must be a string, got {value!r}")
        return value
    return value


def _build(cls: Callable[..., T], section: str, values: Any) -> T:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ParamsError(f"params.yaml: section {section} must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key {section}.{unknown[0]} (known: {', '.join(names)})")
    checked = {k: _check_type(f"{section}.{k}", v, hints[k]) for k, v in values.items()}
    try:
        return cls(**checked)
    except (ValueError, TypeError) as err:
        message = str(err)
        raise ParamsError(message if message.startswith("params.yaml") else f"params.yaml: {message}") from None


def _build_model(values: Any) -> ModelParams:
    if not isinstance(values, dict):
        raise ParamsError(f"params.yaml: section model must be a mapping, got {values!r}")
    values = dict(values)
    preset = values.pop("preset", "small")
    if preset not in PRESETS:
        raise ParamsError(f"params.yaml: model.preset {preset!r} does not exist; choose one of {sorted(PRESETS)}")
    known = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ParamsError(f"params.yaml: unknown key model.{unknown[0]} (known: preset, {', '.join(sorted(known))})")
    params = ModelParams(preset, values)
    params.config(vocab_size=max(16, values.get("pad_id", 0) + 1))  # validate the fields now
    return params


def load_params(path: str | os.PathLike = PARAMS_FILE) -> Params:
    """Read and validate every section of ``path``."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"params.yaml is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    unknown = sorted(set(raw) - set(SECTIONS) - {"flows"})
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]} (known: {', '.join(SECTIONS)})")
    built = {name: (_build_model(raw.get(name) or {}) if name == "model" else _build(cls, name, raw.get(name)))
             for name, cls in SECTIONS.items()}
    return Params(**built, raw=raw)


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; a user error (bad params, bad data, unusable checkpoint) prints
    one line and exits 2, without a traceback."""
    from pipeline.datasets import DataError
    from transformer.checkpoint import CheckpointError

    try:
        main()
    except (ParamsError, DataError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
