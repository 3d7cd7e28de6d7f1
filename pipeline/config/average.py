"""The ``average`` section: how many of the last checkpoints are averaged (§6.1)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipeline.config.section import Section


class AverageParams(Section):
    """§6.1: the last 5 checkpoints for base models, the last 20 for big ones."""

    SECTION = "average"

    last_n: Annotated[int, Field(gt=0)] = 5
