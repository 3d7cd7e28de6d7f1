"""The ``flows`` section: the Prefect flows' retraining schedule and promotion gate."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.section import Section, invalid

RetrainMode = Literal["scratch", "finetune"]
RETRAIN_MODES: tuple[str, ...] = typing.get_args(RetrainMode)


class FlowsParams(Section):
    """The Prefect flows (pipeline/flows): the retraining schedule and the promotion gate.
    ``retrain_mode``: ``scratch`` trains a new model from random weights, ``finetune`` from the
    champion's weights and tokenizer (the flow sets ``train.init_from`` and ``tokenizer.model_from``).
    ``gate_set``: the development set whose paired bootstrap decides a promotion ("" =
    ``data.valid_set``, the one development set the pipeline downloads and translates); test sets
    are compared and reported, never decide (``pipeline.config.params`` checks it against ``data``)."""

    SECTION = "flows"

    schedule_cron: str = "0 3 * * 1"
    schedule_timezone: str = "UTC"
    deployment_name: str = "scheduled-retraining"
    retrain_mode: RetrainMode = "scratch"
    significance: Annotated[float, Field(gt=0, lt=1)] = 0.05
    bootstrap_resamples: Annotated[int, Field(gt=0)] = 1000
    gate_set: str = ""             # "" = data.valid_set: the development set the gate decides on

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, values: Any) -> Any:
        if isinstance(values, dict) and "guarded_test_sets" in values:
            raise invalid("flows.guarded_test_sets was removed: test sets report, they never decide; "
                          "the gate decides on flows.gate_set (a development set); delete the key")
        return values

    @field_validator("schedule_cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise invalid(f"must have 5 fields (minute hour day month weekday), got {value!r}")
        from datetime import datetime

        import cronsim  # Prefect's own scheduler dependency; small, no Prefect import here
        try:
            cronsim.CronSim(value, datetime(2024, 1, 1))
        except cronsim.CronSimError as err:
            raise invalid(f"{value!r} is not a valid cron expression: {err}") from None
        return value

    @field_validator("schedule_timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo
        try:
            ZoneInfo(value)
        except (ValueError, KeyError):
            raise invalid(f"{value!r} is not an IANA time zone") from None
        return value

    @field_validator("deployment_name")
    @classmethod
    def _deployment_name(cls, value: str) -> str:
        if not value.strip() or any(c in value for c in "/%"):
            raise invalid(f"must be non-empty without '/' or '%', got {value!r}")
        return value

    @model_validator(mode="after")
    def _enough_resamples(self) -> FlowsParams:
        if 1 / (self.bootstrap_resamples + 1) >= self.significance:
            raise invalid(f"flows.bootstrap_resamples {self.bootstrap_resamples} is too few for significance "
                          f"{self.significance}: the smallest p-value is 1/(resamples+1)")
        return self
