"""The ``tokenizer`` section: the joint SentencePiece model (§5.1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from pipeline.config.section import Section, invalid
from pipeline.text.names import TEXT_FORMS

MODEL_TYPES = ("bpe", "unigram")


class TokenizerParams(Section):
    """The joint SentencePiece model (§5.1). ``model_from`` ("" = train one) names a SentencePiece
    model file that the tokenizer stage copies instead of training: the tokenizer that initial
    weights (``train.init_from``) were trained with. Its vocabulary must have ``vocab_size`` pieces;
    the other keys do not apply to it. ``text_form`` (``pipeline.text.forms``): the form of the text
    SentencePiece learns from and the model reads and writes, ``raw`` or the Multi30k literature's
    ``lc_norm_tok`` (lowercased, punctuation-normalized, Moses-tokenized, both sides)."""

    SECTION = "tokenizer"

    vocab_size: Annotated[int, Field(ge=16)] = 8000
    model_type: str = "bpe"
    character_coverage: Annotated[float, Field(ge=0.9, le=1)] = 1.0
    input_sentence_size: Annotated[int, Field(gt=0)] = 2_000_000
    seed: int = 1
    model_from: str = ""
    text_form: str = "raw"

    @field_validator("text_form")
    @classmethod
    def _text_form(cls, value: str) -> str:
        if value not in TEXT_FORMS:
            raise invalid(f"must be one of {', '.join(TEXT_FORMS)}, got {value!r}")
        return value

    @field_validator("model_type")
    @classmethod
    def _model_type(cls, value: str) -> str:
        if value not in MODEL_TYPES:
            raise invalid(f"must be {' or '.join(MODEL_TYPES)}, got {value!r}")
        return value
