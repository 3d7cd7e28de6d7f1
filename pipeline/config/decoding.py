"""Decoding settings (§6.1): beam size, length penalty, output length limit, batch, precision,
stopping rule, and the engine that decodes (our PyTorch search or CTranslate2) with its compute type.
The one place these are defined: each setting's default, its limits (for configuration and,
stricter, for one request), whether the tune stage chooses it on the validation set and whether a
request may set it (``DecodingConfig``, a pydantic model: each field's type and constraint, and its
``Setting``). Then the
``evaluate`` and ``tune`` sections of params.yaml, each value checked as the setting it becomes.

Used by the sections below, the translators, the pyfunc model's request params and the server
(``pipeline.serving.decoding``: a request's settings, the tune stage's choice), the translate
command (its options) and the registered versions' settings (``pipeline.serving.registered``).
Adding a setting is adding a field to ``DecodingConfig`` with its ``Setting``. Light: no torch, no MLflow.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from pipeline.config.section import Section, invalid

Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
# When beam search stops a sentence (``transformer.search.beam_search``): "exact", once no live
# hypothesis can beat the beam_size finished ones (the result of searching to the length limit);
# "fairseq", once beam_size hypotheses have finished (cheaper; can miss a longer, better one).
Stopping = Literal["exact", "fairseq"]
STOPPING: tuple[str, ...] = typing.get_args(Stopping)
# Who decodes: "torch", our search (``transformer.search``: GPUs, the reference); "ctranslate2", the
# export stage's model in CTranslate2 (``pipeline.serving.ct2_translator``: fused C++ steps, int8 on CPU).
Engine = Literal["torch", "ctranslate2"]
ENGINES: tuple[str, ...] = typing.get_args(Engine)
# CTranslate2's compute types, in the tune stage's order of preference (int8 first: a quarter of the
# weight traffic, which bounds a CPU's decoding step).
ComputeType = Literal["int8", "float32"]
COMPUTE_TYPES: tuple[str, ...] = typing.get_args(ComputeType)
MAX_BEAM = 16              # a request's beam: decoding cost grows with it; the paper uses 4 (§6.1)
ALPHA_RANGE = (0.0, 10.0)  # a request's length penalty alpha (GNMT's is in [0, 1]; tune's grid reaches 2.5)

PositiveInt = Annotated[int, Field(ge=1)]
NonNegative = Annotated[float, Field(ge=0)]   # ge refuses NaN too


@dataclass(frozen=True)
class Setting:
    """Who sets one decoding setting, beside what it may be (its field's type and constraint).

    ``tuned``: the tune stage chooses it on the validation set; evaluate's null follows that choice.
    ``request``: a request's ``params`` may set it, within ``request_range`` (inclusive) or its choices.
    ``legacy``: what a registered version that records none of it decoded with (None: the default).
    """

    help: str
    tuned: bool = False
    request: bool = False
    request_range: tuple[float, float] | None = None
    legacy: Any = None


@dataclass(frozen=True)
class Rule(Setting):
    """A ``Setting`` with what its field says it may be: ``kind`` (``int``: a positive integer;
    ``float``: a number >= 0; ``str``: one of ``choices``), for the options and requests that parse it."""

    kind: type = str
    choices: tuple[str, ...] = ()

    def phrase(self, given: Any) -> str:
        """Why ``given`` is not a valid value, read after the setting's name."""
        if self.kind is int:
            return f"must be a positive integer, got {given!r}"
        if self.kind is float:
            return f"must be a number >= 0, got {given!r}"
        return f"must be one of {', '.join(self.choices)}, got {given!r}"


class DecodingConfig(BaseModel):
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

    Strict, as params.yaml's sections are: a bool is not an integer, a string not a number; an
    integer alpha becomes a float. A bad value raises ``ValueError`` naming the field
    (``DecodingConfig.beam_size must be a positive integer, got 0``). (The evaluate stage's tuned
    settings with where each came from are ``pipeline.serving.decoding.ChosenDecoding``.)"""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    beam_size: Annotated[PositiveInt, Setting("1 = greedy", tuned=True, request=True,
                                              request_range=(1, MAX_BEAM))] = 4
    alpha: Annotated[NonNegative, Setting("length penalty alpha", tuned=True, request=True,
                                          request_range=ALPHA_RANGE)] = 0.6
    max_len_b: Annotated[PositiveInt, Setting("output length limit: source length + this")] = 50
    batch_sentences: Annotated[PositiveInt, Setting("sentences decoded together")] = 64
    precision: Annotated[Precision, Setting("decoding precision (bf16: faster on CPUs with AVX512-BF16/AMX and "
                                            "on GPUs)")] = "fp32"
    # Versions registered before the rule was a setting were searched, and scored, exactly.
    stopping: Annotated[Stopping, Setting("when beam search stops a sentence: exact (no live hypothesis can beat "
                                          "the finished ones) or fairseq (beam-size hypotheses finished; sooner)",
                                          tuned=True, request=True, legacy="exact")] = "exact"
    # Versions registered before the engine was a setting (no CTranslate2 export) decode with torch.
    engine: Annotated[Engine, Setting("who decodes: torch (our search) or ctranslate2 (the export stage's model; "
                                      "torch where CTranslate2 is missing or cannot load)",
                                      tuned=True, legacy="torch")] = "torch"
    # Tuned with the engine: the tune stage's choice has none where the engine is torch (``ChosenDecoding``).
    compute_type: Annotated[ComputeType, Setting("CTranslate2's compute type (engine ctranslate2 only)",
                                                 tuned=True)] = "float32"

    def __init__(self, *args: Any, **values: Any) -> None:
        if len(args) > len(RULES):
            raise TypeError(f"DecodingConfig takes at most {len(RULES)} settings by position, got {len(args)}")
        by_position = dict(zip(type(self).model_fields, args, strict=False))   # in the fields' order
        twice = sorted(set(by_position) & set(values))
        if twice:
            raise TypeError(f"DecodingConfig got {twice[0]} both by position and by name")
        values = {**by_position, **values}
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ValueError(_one_line(err.errors()[0])) from None

    @model_validator(mode="after")
    def _together(self) -> DecodingConfig:
        if self.engine == "ctranslate2" and self.stopping == "exact":
            raise ValueError("DecodingConfig.stopping exact is our search's rule: CTranslate2 stops once beam_size "
                             "hypotheses have finished; use stopping fairseq with engine ctranslate2")
        return self

    @classmethod
    def of(cls, settings: Any) -> DecodingConfig:
        """From a mapping or an object with these attributes (``params.evaluate``); other keys
        (``attention_sentences``) are ignored, missing or None ones keep the paper's defaults, but
        for the stopping rule of engine ctranslate2: its own, fairseq (exact is our search's)."""
        get = settings.get if isinstance(settings, Mapping) else lambda k: getattr(settings, k, None)
        values = {name: get(name) for name in cls.model_fields if get(name) is not None}
        if values.get("engine") == "ctranslate2":
            values.setdefault("stopping", "fairseq")
        return cls(**values)

    def replace(self, **changes: Any) -> DecodingConfig:
        """A copy with ``changes`` (None values ignored), checked like a new one."""
        return DecodingConfig(**{**self.to_dict(), **{k: v for k, v in changes.items() if v is not None}})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def per_request(self) -> dict[str, Any]:
        """The settings a request may set (``REQUEST``), by name: the keyword arguments of
        ``Translator.translate_ids`` and the params of a registered version's signature."""
        return {name: getattr(self, name) for name in REQUEST}


def _one_line(error: ErrorDetails) -> str:
    """The first problem of a ``DecodingConfig``, named as its field (``DecodingConfig.alpha must be
    a number >= 0, got -0.1``); settings that cannot go together word their own."""
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    name = str(error["loc"][0])
    if error["type"] == "extra_forbidden":
        return f"DecodingConfig has no setting {name!r} (settings: {', '.join(RULES)})"
    return f"DecodingConfig.{name} {RULES[name].phrase(error['input'])}"


def _rule(annotation: Any, metadata: list[Any]) -> Rule:
    setting = next(m for m in metadata if isinstance(m, Setting))
    choices: tuple[str, ...] = typing.get_args(annotation) if typing.get_origin(annotation) is Literal else ()
    return Rule(**vars(setting), kind=str if choices else annotation, choices=choices)


RULES: dict[str, Rule] = {name: _rule(f.annotation, f.metadata) for name, f in DecodingConfig.model_fields.items()}
TUNED = tuple(name for name, rule in RULES.items() if rule.tuned)   # beam_size, alpha, stopping, engine, compute_type
REQUEST = tuple(name for name, rule in RULES.items() if rule.request)    # what a request's params may set
LEGACY = {name: rule.legacy for name, rule in RULES.items() if rule.legacy is not None}
# Each setting alone, checked as its field is (the sections' values, one at a time).
_ONE = {name: TypeAdapter(Annotated[f.annotation, *f.metadata], config=ConfigDict(strict=True))
        for name, f in DecodingConfig.model_fields.items()}


def problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not a valid ``name`` setting on its own ("must be ..., got ..."), or None."""
    try:
        _ONE[name].validate_python(value)
    except ValidationError:
        return RULES[name].phrase(value)
    return None


def typed(name: str, value: Any) -> Any:
    """``value`` as its setting's type where that is exact: an integer alpha as a float (YAML and
    JSON write 1.0 as 1), so that settings read back compare and print as they were written."""
    if RULES[name].kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# ----------------------------------------------------------------------------- params.yaml's sections


def decoding_setting(name: str) -> AfterValidator:
    """A check of one value as ``DecodingConfig``'s field ``name`` (None: unset, the default), as
    the field checks it. Its message reads after the key (``evaluate.alpha`` or ``tune.alphas[1]``)."""
    def check(value: Any) -> Any:
        # Alone: settings that cannot go together are checked below.
        why = None if value is None else problem(name, value)
        if why:
            raise invalid(why)
        return value
    return AfterValidator(check)


class EvaluateParams(Section):
    """Decoding and scoring of the test sets. ``beam_size``, ``alpha``, ``stopping``, ``engine`` and
    ``compute_type`` are optional: null takes the tune stage's choice on the validation set
    (``reports/tune.json``); a value wins (``pipeline.serving.decoding.decoding_settings``)."""

    SECTION = "evaluate"

    beam_size: Annotated[int | None, decoding_setting("beam_size")] = None
    alpha: Annotated[float | None, decoding_setting("alpha")] = None
    stopping: Annotated[str | None, decoding_setting("stopping")] = None
    engine: Annotated[str | None, decoding_setting("engine")] = None
    compute_type: Annotated[str | None, decoding_setting("compute_type")] = None
    max_len_b: Annotated[int, decoding_setting("max_len_b")] = 50
    batch_sentences: Annotated[int, decoding_setting("batch_sentences")] = 64
    attention_sentences: Annotated[int, Field(ge=0)] = 3
    precision: Annotated[str, decoding_setting("precision")] = "fp32"

    @model_validator(mode="after")
    def _together(self) -> EvaluateParams:
        # What the file alone says cannot decode; with a null engine the check waits for tune's choice.
        if self.engine == "ctranslate2" and self.stopping == "exact":
            raise invalid("evaluate.stopping exact is our search's rule, but evaluate.engine is ctranslate2, "
                          "which stops once beam_size hypotheses have finished: set stopping fairseq or null")
        if self.engine == "torch" and self.compute_type is not None:
            raise invalid(f"evaluate.compute_type {self.compute_type} is CTranslate2's, but evaluate.engine is "
                          "torch: leave compute_type null")
        return self


class TuneParams(Section):
    """The decoding grids the tune stage searches on the validation set (§6.1: beam size and alpha
    "chosen after experimentation on the development set"; and the beam search's stopping rule),
    one per engine of ``engines``: torch's ``beam_sizes`` x ``alphas`` (GNMT's penalty) x
    ``stoppings``; CTranslate2's ``beam_sizes`` x ``ct2_alphas`` (its own penalty, |Y| ** alpha) with
    its own stopping rule (fairseq), then its compute types (``pipeline.stages.tune`` has the rules).
    ``max_sentences`` caps the sentences decoded (the first N of ``data.valid_set``; 0 = all). The
    other decoding settings (max_len_b, batch_sentences, precision) are evaluate's, so the choice
    holds for evaluate's decoding."""

    SECTION = "tune"

    engines: list[Annotated[str, decoding_setting("engine")]] = list(ENGINES)
    beam_sizes: list[Annotated[int, decoding_setting("beam_size")]] = [4]
    alphas: list[Annotated[float, decoding_setting("alpha")]] = [0.6, 1.0, 1.5, 2.0, 2.5]
    stoppings: list[Annotated[str, decoding_setting("stopping")]] = ["exact"]
    # Divided by |Y| ** alpha, fairseq's --lenpen (default 1.0; 0.6-1.4 the usual range): 0 ranks by
    # the sum of log-probabilities (short outputs), 1 by their mean. GNMT's ((5 + |Y|) / 6) ** a grows
    # as |Y| ** (a |Y| / (5 + |Y|)): at Multi30k's ~15 pieces its 1.5-1.75 (the sweeps' best) is 1.1-1.3 here.
    ct2_alphas: list[Annotated[float, decoding_setting("alpha")]] = [0.6, 0.8, 1.0, 1.2, 1.4]
    max_sentences: int = 0

    @field_validator("engines", "beam_sizes", "alphas", "stoppings", "ct2_alphas")
    @classmethod
    def _a_grid(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise invalid("must list at least one value")
        if len(set(values)) != len(values):
            raise invalid(f"lists a value twice: {values}")
        return values

    @field_validator("max_sentences")
    @classmethod
    def _max_sentences(cls, value: int) -> int:
        if value < 0:
            raise invalid(f"must be >= 0 (0 = all), got {value}")
        return value
