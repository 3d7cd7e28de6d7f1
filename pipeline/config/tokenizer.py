"""The ``tokenizer`` section: the joint SentencePiece model (§5.1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from pipeline.config.section import Section, invalid

MODEL_TYPES = ("bpe", "unigram")


class TokenizerParams(Section):
    """The joint SentencePiece model (§5.1). ``model_from`` ("" = train one) names a SentencePiece
    model file that the tokenizer stage copies instead of training: the tokenizer that initial
    weights (``train.init_from``) were trained with. Its vocabulary must have ``vocab_size`` pieces;
    the other keys do not apply to it."""

    SECTION = "tokenizer"

    vocab_size: Annotated[int, Field(ge=16)] = 8000
    model_type: str = "bpe"
    character_coverage: Annotated[float, Field(ge=0.9, le=1)] = 1.0
    input_sentence_size: Annotated[int, Field(gt=0)] = 2_000_000
    seed: int = 1
    model_from: str = ""

    @field_validator("model_type")
    @classmethod
    def _model_type(cls, value: str) -> str:
        if value not in MODEL_TYPES:
            raise invalid(f"must be {' or '.join(MODEL_TYPES)}, got {value!r}")
        return value
