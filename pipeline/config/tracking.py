"""The ``tracking`` section: the MLflow experiment the stages log into and the registered model."""

from __future__ import annotations

from pydantic import field_validator

from pipeline.config.section import Section, invalid


class TrackingParams(Section):
    SECTION = "tracking"

    experiment: str = "transformer"
    registered_model: str = "transformer"

    @field_validator("experiment", "registered_model")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise invalid("must not be empty")
        return value
