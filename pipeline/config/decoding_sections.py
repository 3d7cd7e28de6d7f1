"""The ``tune`` and ``evaluate`` sections: the decoding grid searched on the validation set and the
decoding of the test sets (§6.1), each value checked as the decoding setting it becomes
(``pipeline.serving.decoding.DecodingConfig``, the one place those are defined, with the decoding
settings evaluate uses: its own or the tune stage's choice, ``decoding_settings``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, field_validator, model_validator

from pipeline.config.section import Section, invalid
from pipeline.serving.decoding import ENGINES, RULES


def decoding_setting(name: str) -> AfterValidator:
    """A check of one value as ``DecodingConfig``'s field ``name`` (None: unset, the default), by
    its ``Rule``. Its message reads after the key (``evaluate.alpha`` or ``tune.alphas[1]``)."""
    def check(value: Any) -> Any:
        # Alone: settings that cannot go together are checked below.
        problem = None if value is None else RULES[name].problem(value)
        if problem:
            raise invalid(problem)
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
    attention_sentences: int = 3
    precision: Annotated[str, decoding_setting("precision")] = "fp32"

    @field_validator("attention_sentences")
    @classmethod
    def _attention(cls, value: int) -> int:
        if value < 0:
            raise invalid(f"must be >= 0, got {value}")
        return value

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
