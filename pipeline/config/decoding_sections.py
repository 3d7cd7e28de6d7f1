"""The ``tune`` and ``evaluate`` sections: the decoding grid searched on the validation set and the
decoding of the test sets (§6.1), each value checked as the decoding setting it becomes
(``pipeline.serving.decoding.DecodingConfig``, the one place those are defined, with the decoding
settings evaluate uses: its own or the tune stage's choice, ``decoding_settings``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, field_validator

from pipeline.config.section import Section, invalid
from pipeline.serving.decoding import DecodingConfig


def decoding_setting(name: str) -> AfterValidator:
    """A check of one value as ``DecodingConfig``'s field ``name`` (None: unset, the default).
    Its message reads after the key (``evaluate.alpha`` or ``tune.alphas[1]``): the words after
    the package's own name of the field."""
    def check(value: Any) -> Any:
        try:
            DecodingConfig.of({name: value})
        except ValueError as err:
            raise invalid(str(err).partition(" ")[2]) from None
        return value
    return AfterValidator(check)


class EvaluateParams(Section):
    """Decoding and scoring of the test sets. ``beam_size``, ``alpha`` and ``stopping`` are optional:
    null takes the tune stage's choice on the validation set (``reports/tune.json``); a value wins."""

    SECTION = "evaluate"

    beam_size: Annotated[int | None, decoding_setting("beam_size")] = None
    alpha: Annotated[float | None, decoding_setting("alpha")] = None
    stopping: Annotated[str | None, decoding_setting("stopping")] = None
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


class TuneParams(Section):
    """The decoding grid the tune stage searches on the validation set (§6.1: beam size and alpha
    "chosen after experimentation on the development set"; and the beam search's stopping rule).
    ``max_sentences`` caps the sentences decoded (the first N of ``data.valid_set``; 0 = all). The
    other decoding settings (max_len_b, batch_sentences, precision) are evaluate's, so the choice
    holds for evaluate's decoding."""

    SECTION = "tune"

    beam_sizes: list[Annotated[int, decoding_setting("beam_size")]] = [4]
    alphas: list[Annotated[float, decoding_setting("alpha")]] = [0.6, 1.0, 1.5, 2.0, 2.5]
    stoppings: list[Annotated[str, decoding_setting("stopping")]] = ["exact"]
    max_sentences: int = 0

    @field_validator("beam_sizes", "alphas", "stoppings")
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
