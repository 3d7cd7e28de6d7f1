"""The ``tokenizer`` section: the joint SentencePiece model (§5.1)."""

from __future__ import annotations

from pydantic import field_validator

from pipeline.config.section import Section, invalid

MODEL_TYPES = ("bpe", "unigram")


class TokenizerParams(Section):
    """The joint SentencePiece model (§5.1). ``model_from`` ("" = train one) names a SentencePiece
    model file that the tokenizer stage copies instead of training: the tokenizer that initial
    weights (``train.init_from``) were trained with. Its vocabulary must have ``vocab_size`` pieces;
    the other keys do not apply to it."""

    SECTION = "tokenizer"

    vocab_size: int = 8000
    model_type: str = "bpe"
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000
    seed: int = 1
    model_from: str = ""

    @field_validator("vocab_size")
    @classmethod
    def _vocab(cls, value: int) -> int:
        if value < 16:
            raise invalid(f"must be at least 16, got {value}")
        return value

    @field_validator("model_type")
    @classmethod
    def _model_type(cls, value: str) -> str:
        if value not in MODEL_TYPES:
            raise invalid(f"must be {' or '.join(MODEL_TYPES)}, got {value!r}")
        return value

    @field_validator("character_coverage")
    @classmethod
    def _coverage(cls, value: float) -> float:
        if not 0.9 <= value <= 1.0:
            raise invalid(f"must be in [0.9, 1], got {value}")
        return value

    @field_validator("input_sentence_size")
    @classmethod
    def _sentences(cls, value: int) -> int:
        if value < 1:
            raise invalid(f"must be positive, got {value}")
        return value
