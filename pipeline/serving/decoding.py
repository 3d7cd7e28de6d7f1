"""How a translator decodes (§6.1): beam size, length penalty, output length limit, batch,
precision, stopping rule, and the engine that decodes (our PyTorch search or CTranslate2) with its
compute type. The one place these settings are defined: each setting's default, its
limits (for configuration and, stricter, for one request), whether the tune stage chooses it on the
validation set and whether a request may set it, and the checks.

Used by ``pipeline.config.params`` (the ``evaluate`` and ``tune`` sections), the translator, the
pyfunc model's request params and the server (``request_settings``), the translate command (its
options), and the registered versions' settings (``pipeline.serving.registered``). Adding a
setting is adding a field to ``DecodingConfig`` with its ``Rule``. Light: no torch, no MLflow
(configuration imports it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.errors import ParamsError, TuneReportMissing

PRECISIONS = ("fp32", "bf16")
# When beam search stops a sentence (``transformer.search.beam_search``): "exact", once no live
# hypothesis can beat the beam_size finished ones (the result of searching to the length limit);
# "fairseq", once beam_size hypotheses have finished (cheaper; can miss a longer, better one).
STOPPING = ("exact", "fairseq")
# Who decodes: "torch", our search (``transformer.search``: GPUs, the reference); "ctranslate2", the
# export stage's model in CTranslate2 (``pipeline.serving.ct2_translator``: fused C++ steps, int8 on CPU).
ENGINES = ("torch", "ctranslate2")
# CTranslate2's compute types, in the tune stage's order of preference (int8 first: a quarter of the
# weight traffic, which bounds a CPU's decoding step).
COMPUTE_TYPES = ("int8", "float32")
MAX_BEAM = 16              # a request's beam: decoding cost grows with it; the paper uses 4 (§6.1)
ALPHA_RANGE = (0.0, 10.0)  # a request's length penalty alpha (GNMT's is in [0, 1]; tune's grid reaches 2.5)


@dataclass(frozen=True)
class Rule:
    """What one decoding setting may be and who sets it.

    ``kind``: ``int`` (a positive integer), ``float`` (a number >= 0) or ``str`` (one of ``choices``).
    ``tuned``: the tune stage chooses it on the validation set; evaluate's null follows that choice.
    ``request``: a request's ``params`` may set it, within ``request_range`` (inclusive) or ``choices``.
    ``legacy``: what a registered version that records none of it decoded with (None: the default).
    """

    kind: type
    help: str
    choices: tuple[str, ...] = ()
    tuned: bool = False
    request: bool = False
    request_range: tuple[float, float] | None = None
    legacy: Any = None

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a valid setting ("must be ..., got ..."), or None."""
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"must be a positive integer, got {value!r}"
        # ``not >= 0`` also refuses NaN
        if self.kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
            return f"must be a number >= 0, got {value!r}"
        if self.kind is str and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}, got {value!r}"
        return None


def _setting(default: Any, rule: Rule) -> Any:
    return field(default=default, metadata={"rule": rule})


@dataclass(frozen=True)
class DecodingConfig:
    """The paper's defaults (§6.1: beam 4, length penalty alpha 0.6, output up to source length
    + 50), decoded by our search.

    What each setting means for each engine:

    * ``beam_size``: the same for both (1: greedy).
    * ``alpha``: torch divides a finished hypothesis's log-probability by GNMT's ((5 + |Y|) / 6) ** alpha
      (§6.1); CTranslate2 (its ``length_penalty``) by |Y| ** alpha. Not the same penalty: each engine's
      alpha is chosen on val on its own grid.
    * ``max_len_b``: per sentence in both: at most source pieces + max_len_b output pieces (within the
      model's positions). CTranslate2's ``max_decoding_length`` is one limit per call: a sentence is
      decoded with its limit rounded up to a multiple of 16 and its hypothesis cut to its own limit
      (``ct2_translator.LIMIT_BUCKET``), a function of the sentence alone: its translation never depends
      on the others in its batch (greedy: exactly ours; a beam that reached the limit may rank
      differently).
    * ``batch_sentences``: torch's batches (by length); CTranslate2's ``max_batch_size`` (in examples:
      it sorts by length and spreads the batches over its ``inter_threads``).
    * ``precision``: torch only (fp32 or bf16 weights); ``compute_type``: CTranslate2 only (its weights
      converted at load: int8 or float32).
    * ``stopping``: ours (``STOPPING``). CTranslate2 stops a sentence on its own rule, once beam_size
      hypotheses have finished (``patience`` 1), which is ``fairseq``: ``exact`` is refused with it.
      With alpha 0 its search instead ends when its best candidate ends (an early exit that 4.x takes
      whenever no penalty is set), whose result is that of ``exact`` (tests/pipeline/serving/
      test_engine_equality.py holds both to equality).
    * Padding and BOS are never emitted by either (``transformer.search``; CTranslate2's
      ``suppress_sequences``).

    (``Decoding`` below is another thing: the beam size, alpha and stopping rule the evaluate
    stage chose, and where each came from.)"""

    beam_size: int = _setting(4, Rule(int, "1 = greedy", tuned=True, request=True, request_range=(1, MAX_BEAM)))
    alpha: float = _setting(0.6, Rule(float, "length penalty alpha", tuned=True, request=True,
                                      request_range=ALPHA_RANGE))
    max_len_b: int = _setting(50, Rule(int, "output length limit: source length + this"))
    batch_sentences: int = _setting(64, Rule(int, "sentences decoded together"))
    precision: str = _setting("fp32", Rule(str, "decoding precision (bf16: faster on CPUs with AVX512-BF16/AMX "
                                                "and on GPUs)", choices=PRECISIONS))
    # Versions registered before the rule was a setting were searched, and scored, exactly.
    stopping: str = _setting("exact", Rule(str, "when beam search stops a sentence: exact (no live hypothesis can "
                                                "beat the finished ones) or fairseq (beam-size hypotheses "
                                                "finished; sooner)", choices=STOPPING, tuned=True, request=True,
                                           legacy="exact"))
    # Versions registered before the engine was a setting (no CTranslate2 export) decode with torch.
    engine: str = _setting("torch", Rule(str, "who decodes: torch (our search) or ctranslate2 (the export "
                                              "stage's model; torch where CTranslate2 is missing or cannot load)",
                                         choices=ENGINES, tuned=True, legacy="torch"))
    # Tuned with the engine: the tune stage's choice has none where the engine is torch (``Decoding``).
    compute_type: str = _setting("float32", Rule(str, "CTranslate2's compute type (engine ctranslate2 only)",
                                                 choices=COMPUTE_TYPES, tuned=True))

    def __post_init__(self) -> None:
        for name, rule in RULES.items():
            problem = rule.problem(getattr(self, name))
            if problem:
                raise ValueError(f"DecodingConfig.{name} {problem}")
        if self.engine == "ctranslate2" and self.stopping == "exact":
            raise ValueError("DecodingConfig.stopping exact is our search's rule: CTranslate2 stops once beam_size "
                             "hypotheses have finished; use stopping fairseq with engine ctranslate2")

    @classmethod
    def of(cls, settings: Any) -> DecodingConfig:
        """From a mapping or an object with these attributes (``params.evaluate``); other keys
        (``attention_sentences``) are ignored, missing or None ones keep the paper's defaults, but
        for the stopping rule of engine ctranslate2: its own, fairseq (exact is our search's)."""
        get = settings.get if isinstance(settings, Mapping) else lambda k: getattr(settings, k, None)
        values = {f.name: get(f.name) for f in fields(cls) if get(f.name) is not None}
        if values.get("engine") == "ctranslate2":
            values.setdefault("stopping", "fairseq")
        return cls(**values)

    def replace(self, **changes: Any) -> DecodingConfig:
        """A copy with ``changes`` (None values ignored), checked like a new one."""
        return DecodingConfig(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def per_request(self) -> dict[str, Any]:
        """The settings a request may set (``REQUEST``), by name: the keyword arguments of
        ``Translator.translate_ids`` and the params of a registered version's signature."""
        return {name: getattr(self, name) for name in REQUEST}


RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(DecodingConfig)}
TUNED = tuple(name for name, rule in RULES.items() if rule.tuned)   # beam_size, alpha, stopping, engine, compute_type
REQUEST = tuple(name for name, rule in RULES.items() if rule.request)    # what a request's params may set
LEGACY = {name: rule.legacy for name, rule in RULES.items() if rule.legacy is not None}


def typed(name: str, value: Any) -> Any:
    """``value`` as its setting's type where that is exact: an integer alpha as a float (YAML and
    JSON write 1.0 as 1), so that settings read back compare and print as they were written."""
    if RULES[name].kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


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
class Decoding:
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
            raise AttributeError(f"Decoding has no {name!r} (settings: {', '.join(TUNED)}, and each's _from)")
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


def decoding_settings(evaluate: Any, tune_report: str | os.PathLike = TUNE_REPORT) -> Decoding:
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
    return Decoding(settings, sources)
