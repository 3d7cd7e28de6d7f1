"""What a translator decodes with, from the settings ``pipeline.config.decoding`` defines: one
request's (its ``params``, within the request's limits: ``request_settings``) and the evaluate
stage's (params.yaml's ``evaluate`` where set, the tune stage's choice on the validation set for the
rest: ``decoding_settings``). Light: no torch, no MLflow.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.decoding import REQUEST, RULES, TUNED, DecodingConfig, typed
from pipeline.config.errors import ParamsError, TuneReportMissing

# ----------------------------------------------------------------------------- one request's settings


class RequestError(ValueError):
    """A request's ``params`` are not settings it may decode with; the message is the answer (400)."""


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _request_value(name: str, value: Any) -> Any:
    """``value`` of a request's param ``name``, parsed (JSON clients send 4.0 or "4") and checked
    against the request's limits."""
    rule = RULES[name]
    if rule.kind in (int, float):
        number: Any = None
        if not isinstance(value, bool):
            try:
                number = float(value) if isinstance(value, (int, float, str)) else None
            except (ValueError, OverflowError):   # OverflowError: an integer past float's range
                number = None
        if number is None or not math.isfinite(number) or (rule.kind is int and not number.is_integer()):
            article = "an integer" if rule.kind is int else "a number"
            raise RequestError(f"params: {name} must be {article}, got {_describe(value)}")
        number = int(number) if rule.kind is int else number
        low, high = rule.request_range or (0, math.inf)
        if not low <= number <= high:
            raise RequestError(f"params: {name} must be between {low:g} and {high:g}, got {number}")
        return number
    if value not in rule.choices:
        raise RequestError(f"params: {name} must be one of {', '.join(rule.choices)}, got {_describe(value)}")
    return value


def request_settings(defaults: DecodingConfig, params: Mapping[str, Any] | None) -> DecodingConfig:
    """What one request decodes with: ``defaults`` (the served version's) with the ``REQUEST``
    settings its ``params`` give, each checked against the request's limits (``RequestError``).
    Other keys are ignored, as MLflow's scoring server ignores params its signature lacks."""
    params = params or {}
    try:
        return defaults.replace(**{name: _request_value(name, params[name]) for name in REQUEST
                                   if params.get(name) is not None})
    except RequestError:
        raise
    except ValueError as err:   # settings valid alone but not together (stopping exact on CTranslate2)
        raise RequestError(f"params: {str(err).removeprefix('DecodingConfig.')}") from None


# ----------------------------------------------------------------------------- the tune stage's choice

TUNE_REPORT = Path("reports/tune.json")   # the tune stage's choice (relative to the repository root)
# What a tune report written before the stage chose the engine decoded with (our search: no compute type).
BEFORE_ENGINES = {"engine": "torch", "compute_type": None}


def tune_detail(tune_report: str | os.PathLike) -> Path:
    """The tune report's detail beside it (``reports/tune.json`` -> ``reports/tune/scores.json``),
    whose ``engines`` hold each engine's own chosen point."""
    return Path(tune_report).with_suffix("") / "scores.json"


@dataclass(frozen=True)
class ChosenDecoding:
    """The ``TUNED`` settings the evaluate stage (and the model it registers) decode with, and where
    each came from: ``params`` (set in evaluate) or ``tune`` (null there: the tune stage's choice on
    the validation set). ``compute_type`` is None where the engine is torch (CTranslate2's only;
    torch decodes at ``precision``), and comes from where the engine does. Read as attributes:
    ``beam_size``, ``beam_size_from``, ..."""

    settings: Mapping[str, Any]
    sources: Mapping[str, str]

    def __getattr__(self, name: str) -> Any:   # only names that are not fields get here
        key = name.removesuffix("_from")
        if key not in TUNED:
            raise AttributeError(f"ChosenDecoding has no {name!r} (settings: {', '.join(TUNED)}, and each's _from)")
        return (self.sources if name.endswith("_from") else self.settings)[key]

    def as_dict(self) -> dict[str, Any]:
        """``{"beam_size": 4, ..., "beam_size_from": "tune", ...}``"""
        return {**{k: self.settings[k] for k in TUNED}, **{f"{k}_from": self.sources[k] for k in TUNED}}

    def applied_to(self, config: DecodingConfig) -> DecodingConfig:
        """``config`` with these settings (a None compute type leaves the config's: torch ignores it)."""
        return config.replace(**{k: self.settings[k] for k in TUNED})


def _checked(chosen: Mapping[str, Any]) -> dict[str, Any]:
    """A tune choice (``TUNED``, compute_type None with torch) checked as the settings it becomes."""
    settings = {key: typed(key, chosen[key]) for key in TUNED}
    if settings["engine"] == "ctranslate2" and settings["compute_type"] is None:
        raise ValueError("compute_type is null with engine ctranslate2")
    DecodingConfig(**{k: v for k, v in settings.items() if k != "compute_type" or v is not None})
    return settings


def _tune_choice(path: Path, missing: str, engine: str | None) -> dict[str, Any]:
    """The tune stage's choice in ``path`` or, where ``engine`` is set to another engine than it
    chose, that engine's own chosen point (its alpha is its own penalty) in the report's detail."""
    if not path.is_file():
        raise TuneReportMissing(f"{path} does not exist: {missing} null means the tune stage's choice; run it "
                                f"(dvc repro) or set {missing} in params.yaml")
    try:
        report = yaml.safe_load(path.read_text())["chosen"]   # JSON is YAML
        chosen = _checked({**BEFORE_ENGINES, **report})
    except (yaml.YAMLError, TypeError, KeyError, ValueError) as err:
        reason = " ".join(str(err).split())   # one line (YAML's messages quote the text over several)
        raise ParamsError(f"{path} holds no valid choice ({type(err).__name__}: {reason}): rerun the tune stage "
                          "(dvc repro tune)") from None
    if engine is None or engine == chosen["engine"]:
        return chosen
    detail = tune_detail(path)
    try:
        return _checked({"compute_type": None, **yaml.safe_load(detail.read_text())["engines"][engine]["chosen"]})
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError):
        raise ParamsError(f"evaluate.engine {engine} is not the tune stage's choice ({chosen['engine']}) and {detail} "
                          f"holds no choice of its own for it: set {missing}, or add {engine} to tune.engines "
                          "(tune searches CTranslate2 only where it can load)") from None


def decoding_settings(evaluate: Any, tune_report: str | os.PathLike = TUNE_REPORT) -> ChosenDecoding:
    """``evaluate``'s (``params.evaluate``: a mapping or an object) ``TUNED`` settings where set,
    the tune stage's choice (``tune_report``, read only when one of them is null) for the others.

    Each engine's alpha is its own length penalty (``DecodingConfig``): where ``evaluate.engine``
    names another engine than tune chose, the null settings are that engine's own chosen point
    (``engines`` in ``tune_detail(tune_report)``). ``compute_type`` is CTranslate2's: None with
    engine torch (not read from tune then), and set with torch it is an error.

    Raises ``TuneReportMissing`` when the report is needed and absent, ``ParamsError`` when it holds
    no valid choice or when the settings cannot decode together (stopping exact with CTranslate2)."""
    get = evaluate.get if isinstance(evaluate, Mapping) else lambda k: getattr(evaluate, k, None)
    given = {key: get(key) for key in TUNED}
    needed = [k for k, v in given.items() if v is None and not (k == "compute_type" and given["engine"] == "torch")]
    # The compute type follows a null engine (none for torch): named only where the engine is set.
    missing = " and ".join(f"evaluate.{k}" for k in needed if k != "compute_type" or "engine" not in needed)
    chosen = _tune_choice(Path(tune_report), missing, given["engine"]) if needed else {}
    settings = {key: chosen.get(key) if given[key] is None else given[key] for key in TUNED}
    sources = {key: "tune" if given[key] is None else "params" for key in TUNED}
    if settings["engine"] == "torch":
        if given["compute_type"] is not None:
            raise ParamsError(f"evaluate.compute_type {given['compute_type']} is CTranslate2's, but the engine is "
                              f"torch (from {sources['engine']}): set evaluate.engine ctranslate2 or leave "
                              "evaluate.compute_type null")
        settings["compute_type"], sources["compute_type"] = None, sources["engine"]
    try:
        DecodingConfig.of(settings)
    except ValueError as err:   # valid alone, not together: stopping exact (params) with ctranslate2 (tune)
        used = ", ".join(f"{k} {settings[k]} ({sources[k]})" for k in ("engine", "stopping"))
        raise ParamsError(f"evaluate: {used} cannot decode together: "
                          f"{str(err).removeprefix('DecodingConfig.')}") from None
    return ChosenDecoding(settings, sources)
