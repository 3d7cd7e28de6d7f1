"""``params.yaml`` read into typed, validated config objects: the one source of configuration.

Every section maps onto a dataclass. Unknown keys, wrong types and bad values raise
``ParamsError`` with one line naming the key, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipeline.data.registry import check_data_params
from pipeline.serving.decoding import DecodingConfig
from transformer.config import PRESETS, ConfigError, ModelConfig, build_config
from transformer.train_config import TrainConfig

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
    incoming_dir: str = "data/incoming"   # new parallel data appended to train ("" = none)

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
        if self.valid_set in self.test_sets:
            raise ValueError(f"data.valid_set {self.valid_set!r} is also in data.test_sets: the validation set "
                             "chooses (checkpoints, decoding settings, the champion), test sets only report")
        check_data_params(self.dataset, self.src_lang, self.tgt_lang, self.valid_set, self.test_sets)

    @property
    def pair(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"

    def resolved_mirror(self) -> str:
        """``DATA_MIRROR`` from the environment, else ``data.mirror`` ("" = upstream)."""
        return os.environ.get("DATA_MIRROR", "") or self.mirror


@dataclass(frozen=True)
class TokenizerParams:
    """The joint SentencePiece model (§5.1). ``model_from`` ("" = train one) names a SentencePiece
    model file that the tokenizer stage copies instead of training: the tokenizer that initial
    weights (``train.init_from``) were trained with. Its vocabulary must have ``vocab_size`` pieces;
    the other keys do not apply to it."""

    vocab_size: int = 8000
    model_type: str = "bpe"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000
    seed: int = 1
    model_from: str = ""

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

    preset: str = "laptop"
    overrides: dict[str, Any] = field(default_factory=dict)

    def config(self, vocab_size: int) -> ModelConfig:
        try:
            return build_config(self.preset, vocab_size, **self.overrides)
        except ConfigError as err:
            raise ParamsError(f"params.yaml: {model_key_message(err)}") from None


def model_key_message(err: ConfigError) -> str:
    """The package's message with its field names (``ModelConfig.d_model``, ``preset``) given as the
    params.yaml keys of the model section (``model.d_model``, ``model.preset``)."""
    message = str(err).replace("ModelConfig.", "model.")
    if err.fields and not message.startswith("model.") and message.startswith(err.fields[0]):
        message = f"model.{message}"
    return message


@dataclass(frozen=True)
class AverageParams:
    last_n: int = 5

    def __post_init__(self) -> None:
        if self.last_n < 1:
            raise ValueError(f"average.last_n must be positive, got {self.last_n}")


# The decoding settings the tune stage chooses on the validation set (evaluate's null ones follow it).
TUNED = ("beam_size", "alpha", "stopping")


@dataclass(frozen=True)
class EvaluateParams:
    """Decoding and scoring of the test sets. ``beam_size``, ``alpha`` and ``stopping`` are optional:
    null takes the tune stage's choice on the validation set (``reports/tune.json``); a value wins."""

    beam_size: int | None = None
    alpha: float | None = None
    stopping: str | None = None
    max_len_b: int = 50
    batch_sentences: int = 64
    attention_sentences: int = 3
    precision: str = "fp32"

    def __post_init__(self) -> None:
        try:   # the decoding keys are checked where they are defined, named as params.yaml keys
            DecodingConfig.of(self)
        except ValueError as err:
            raise ValueError(str(err).replace("DecodingConfig.", "evaluate.")) from None
        if self.attention_sentences < 0:
            raise ValueError(f"evaluate.attention_sentences must be >= 0, got {self.attention_sentences}")


@dataclass(frozen=True)
class TuneParams:
    """The decoding grid the tune stage searches on the validation set (§6.1: beam size and alpha
    "chosen after experimentation on the development set"; and the beam search's stopping rule).
    ``max_sentences`` caps the sentences decoded (the first N of ``data.valid_set``; 0 = all). The
    other decoding settings (max_len_b, batch_sentences, precision) are evaluate's, so the choice
    holds for evaluate's decoding."""

    beam_sizes: list[int] = field(default_factory=lambda: [4])
    alphas: list[float] = field(default_factory=lambda: [0.6, 1.0, 1.5, 2.0, 2.5])
    stoppings: list[str] = field(default_factory=lambda: ["exact"])
    max_sentences: int = 0

    def __post_init__(self) -> None:
        grids = (("beam_sizes", "beam_size", self.beam_sizes), ("alphas", "alpha", self.alphas),
                 ("stoppings", "stopping", self.stoppings))
        for key, _, values in grids:
            if not values:
                raise ValueError(f"tune.{key} must list at least one value")
            if len(set(values)) != len(values):
                raise ValueError(f"tune.{key} lists a value twice: {values}")
        for key, field_name, values in grids:
            for value in values:   # each grid value checked as the decoding setting it becomes
                try:
                    DecodingConfig(**{field_name: value})
                except ValueError as err:
                    raise ValueError(f"tune.{key}: {str(err).replace('DecodingConfig.', '')}") from None
        if self.max_sentences < 0:
            raise ValueError(f"tune.max_sentences must be >= 0 (0 = all), got {self.max_sentences}")


TUNE_REPORT = Path("reports/tune.json")   # the tune stage's choice (relative to the repository root)


@dataclass(frozen=True)
class Decoding:
    """The beam size, alpha and stopping rule the evaluate stage (and the model it registers) decode
    with, and where each came from: ``params`` (set in evaluate) or ``tune`` (null there: the tune
    stage's choice on the validation set)."""

    beam_size: int
    alpha: float
    stopping: str
    beam_size_from: str
    alpha_from: str
    stopping_from: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def decoding_settings(evaluate: EvaluateParams, tune_report: str | os.PathLike = TUNE_REPORT) -> Decoding:
    """``evaluate``'s beam size, alpha and stopping rule where set, the tune stage's choice
    (``tune_report``, read only when one of them is null) for the others."""
    given = {key: getattr(evaluate, key) for key in TUNED}
    missing = " and ".join(f"evaluate.{k}" for k, v in given.items() if v is None)
    chosen: dict[str, Any] = {}
    if missing:
        path = Path(tune_report)
        if not path.is_file():
            raise ParamsError(f"{path} does not exist: {missing} null means the tune stage's choice; run it "
                              f"(dvc repro) or set {missing} in params.yaml")
        try:
            report = yaml.safe_load(path.read_text())["chosen"]   # JSON is YAML
            chosen = {key: report[key] for key in TUNED}
            if isinstance(chosen["alpha"], int) and not isinstance(chosen["alpha"], bool):
                chosen["alpha"] = float(chosen["alpha"])
            DecodingConfig(**chosen)   # checked as the settings they become
        except (yaml.YAMLError, TypeError, KeyError, ValueError) as err:
            raise ParamsError(f"{path} holds no valid choice ({type(err).__name__}: {err}): rerun the tune stage "
                              "(dvc repro tune)") from None
    return Decoding(**{key: chosen[key] if given[key] is None else given[key] for key in TUNED},
                    **{f"{key}_from": "tune" if given[key] is None else "params" for key in TUNED})


@dataclass(frozen=True)
class TrackingParams:
    experiment: str = "transformer"
    registered_model: str = "transformer"

    def __post_init__(self) -> None:
        if not self.experiment.strip():
            raise ValueError("tracking.experiment must not be empty")
        if not self.registered_model.strip():
            raise ValueError("tracking.registered_model must not be empty")


RETRAIN_MODES = ("scratch", "finetune")


@dataclass(frozen=True)
class FlowsParams:
    """The Prefect flows (pipeline/flows): the retraining schedule and the promotion gate.
    ``retrain_mode``: ``scratch`` trains a new model from random weights, ``finetune`` from the
    champion's weights and tokenizer (the flow sets ``train.init_from`` and ``tokenizer.model_from``).
    ``gate_set``: the development set whose paired bootstrap decides a promotion ("" =
    ``data.valid_set``, the one development set the pipeline downloads and translates); test sets
    are compared and reported, never decide."""

    schedule_cron: str = "0 3 * * 1"
    schedule_timezone: str = "UTC"
    deployment_name: str = "scheduled-retraining"
    retrain_mode: str = "scratch"
    significance: float = 0.05
    bootstrap_resamples: int = 1000
    gate_set: str = ""             # "" = data.valid_set: the development set the gate decides on

    def __post_init__(self) -> None:
        fields = self.schedule_cron.split()
        if len(fields) != 5:
            raise ValueError(f"flows.schedule_cron must have 5 fields (minute hour day month weekday), "
                             f"got {self.schedule_cron!r}")
        from datetime import datetime
        from zoneinfo import ZoneInfo

        import cronsim  # Prefect's own scheduler dependency; small, no Prefect import here
        try:
            cronsim.CronSim(self.schedule_cron, datetime(2024, 1, 1))
        except cronsim.CronSimError as err:
            raise ValueError(f"flows.schedule_cron {self.schedule_cron!r} "
                             f"is not a valid cron expression: {err}") from None
        try:
            ZoneInfo(self.schedule_timezone)
        except (ValueError, KeyError):
            raise ValueError(f"flows.schedule_timezone {self.schedule_timezone!r} is not an IANA time zone") from None
        if not self.deployment_name.strip() or any(c in self.deployment_name for c in "/%"):
            raise ValueError("flows.deployment_name must be non-empty without '/' or '%', "
                             f"got {self.deployment_name!r}")
        if self.retrain_mode not in RETRAIN_MODES:
            raise ValueError(f"flows.retrain_mode must be one of {', '.join(RETRAIN_MODES)}, got {self.retrain_mode!r}")
        if not 0 < self.significance < 1:
            raise ValueError(f"flows.significance must be in (0, 1), got {self.significance}")
        if 1 / (self.bootstrap_resamples + 1) >= self.significance:
            raise ValueError(f"flows.bootstrap_resamples {self.bootstrap_resamples} is too few for significance "
                             f"{self.significance}: the smallest p-value is 1/(resamples+1)")


@dataclass(frozen=True)
class Params:
    data: DataParams
    tokenizer: TokenizerParams
    model: ModelParams
    train: TrainConfig
    average: AverageParams
    tune: TuneParams
    evaluate: EvaluateParams
    tracking: TrackingParams
    flows: FlowsParams
    raw: dict[str, Any]

    @property
    def gate_set(self) -> str:
        """The development set the promotion gate decides on: ``flows.gate_set`` or ``data.valid_set``."""
        return self.flows.gate_set or self.data.valid_set

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
    "average": AverageParams, "tune": TuneParams, "evaluate": EvaluateParams, "tracking": TrackingParams,
    "flows": FlowsParams,
}


def _check_type(key: str, value: Any, annotation: Any) -> Any:
    """Check ``value`` against a field annotation; ints are accepted where floats are expected."""
    hint = annotation
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):   # ``int | None``: null, or a value of the type
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or len(options) != 1:
            return value
        return _check_type(key, value, options[0])
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
        message = str(err).replace("TrainConfig.", "train.")   # the package's field names, as params keys
        raise ParamsError(message if message.startswith("params.yaml") else f"params.yaml: {message}") from None


def _build_model(values: Any) -> ModelParams:
    if not isinstance(values, dict):
        raise ParamsError(f"params.yaml: section model must be a mapping, got {values!r}")
    values = dict(values)
    preset = values.pop("preset", "laptop")
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
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(err, "problem", None) or " ".join(str(err).split())
        raise ParamsError(f"params.yaml is not valid YAML{where}: {reason}") from None
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]} (known: {', '.join(SECTIONS)})")
    if isinstance(raw.get("flows"), dict) and "guarded_test_sets" in raw["flows"]:
        raise ParamsError("params.yaml: flows.guarded_test_sets was removed: test sets report, they never decide; "
                          "the gate decides on flows.gate_set (a development set); delete the key")
    built = {name: (_build_model(raw.get(name) or {}) if name == "model" else _build(cls, name, raw.get(name)))
             for name, cls in SECTIONS.items()}
    _check_gate_set(built["flows"], built["data"])
    _check_init_files(built["train"], built["tokenizer"], path.parent)
    return Params(**built, raw=raw)


def _check_gate_set(flows: FlowsParams, data: DataParams) -> None:
    """The gate decides on development data: never a test set, and a set the pipeline translates."""
    gate_set = flows.gate_set
    if not gate_set:
        return
    if gate_set in data.test_sets:
        raise ParamsError(f"params.yaml: flows.gate_set {gate_set!r} is a test set (data.test_sets): test sets "
                          f"report, they never decide; leave it empty for data.valid_set ({data.valid_set!r})")
    if gate_set != data.valid_set:
        raise ParamsError(f"params.yaml: flows.gate_set {gate_set!r} is not data.valid_set ({data.valid_set!r}), "
                          "the development set the pipeline downloads and translates; leave it empty or name it")


def _check_init_files(train: TrainConfig, tokenizer: TokenizerParams, root: Path) -> None:
    """Fine-tuning's inputs exist, and come as a pair: initial weights only make sense with the
    tokenizer they were trained with (their embedding rows are its pieces). Relative paths are
    relative to the repository root, where params.yaml is and DVC runs the stages."""
    for key, value in (("train.init_from", train.init_from), ("tokenizer.model_from", tokenizer.model_from)):
        if value and not (root / value).is_file():
            where = "" if Path(value).is_absolute() else f" in {root.resolve()}"
            raise ParamsError(f"params.yaml: {key} {value} does not exist{where}")
    if train.init_from and not tokenizer.model_from:
        raise ParamsError(f"params.yaml: train.init_from is {train.init_from} but tokenizer.model_from is empty: "
                          "initial weights need the tokenizer they were trained with (set tokenizer.model_from)")


def with_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` (params.yaml's mapping) with ``section.key=value`` overrides applied, values read as
    YAML, as ``dvc exp run -S`` applies them (a copy; ``raw`` is left as it was)."""
    merged = {name: dict(section) if isinstance(section, dict) else section for name, section in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and section and name):
            raise ParamsError(f"override {item!r} is not section.key=value (e.g. train.max_steps=100)")
        if not isinstance(merged.get(section), dict):
            merged[section] = {}
        try:
            merged[section][name] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            raise ParamsError(f"override {item!r}: the value is not valid YAML") from None
    return merged


def check(path: str | os.PathLike = PARAMS_FILE, overrides: list[str] | None = None) -> Params:
    """Validate every section of ``path`` (with ``overrides`` applied) before a pipeline starts:
    DVC removes a stage's outputs before the stage runs and has no hook before that, so a bad value
    must be refused here, not by the stage that reads it. Raises ``ParamsError`` naming the key."""
    path = Path(path)
    if not overrides:
        return load_params(path)
    raw = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(raw, dict):
        return load_params(path)   # its own error: missing, not YAML, not a mapping
    import tempfile

    # In params.yaml's folder, so that relative paths (train.init_from, ...) resolve as they will.
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".params-check-", suffix=".yaml") as f:
        yaml.safe_dump(with_overrides(raw, overrides), f, sort_keys=False)
        f.flush()
        return load_params(f.name)
