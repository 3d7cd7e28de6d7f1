"""The ``average`` section: how many of the last checkpoints are averaged (§6.1)."""

from __future__ import annotations

from pydantic import field_validator

from pipeline.config.section import Section, invalid


class AverageParams(Section):
    """§6.1: the last 5 checkpoints for base models, the last 20 for big ones."""

    SECTION = "average"

    last_n: int = 5

    @field_validator("last_n")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise invalid(f"must be positive, got {value}")
        return value
