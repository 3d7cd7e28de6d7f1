"""The ``data`` section: which corpus, which languages, which validation and test sets, and how the
training pairs are cleaned."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from pipeline.config.section import Section, invalid
from pipeline.data.registry import check_data_params


class DataParams(Section):
    SECTION = "data"

    dataset: str = "multi30k"
    src_lang: str = "en"
    tgt_lang: str = "de"
    mirror: str = ""
    valid_set: str = "val"
    test_sets: list[str] = ["test_2016_flickr"]
    max_words: Annotated[int, Field(gt=0)] = 250
    max_ratio: Annotated[float, Field(ge=1)] = 9.0
    limit_train_pairs: Annotated[int, Field(ge=0)] = 0
    incoming_dir: str = "data/incoming"   # new parallel data appended to train ("" = none)

    @field_validator("test_sets")
    @classmethod
    def _some_test_set(cls, value: list[str]) -> list[str]:
        if not value:
            raise invalid("must name at least one test set")
        return value

    @model_validator(mode="after")
    def _choices(self) -> DataParams:
        if self.src_lang == self.tgt_lang:
            raise invalid(f"data.src_lang and data.tgt_lang are both {self.src_lang!r}")
        if self.valid_set in self.test_sets:
            raise invalid(f"data.valid_set {self.valid_set!r} is also in data.test_sets: the validation set "
                          "chooses (checkpoints, decoding settings, the champion), test sets only report")
        try:
            check_data_params(self.dataset, self.src_lang, self.tgt_lang, self.valid_set, self.test_sets)
        except ValueError as err:   # its messages start with the params.yaml key
            raise invalid(str(err)) from None
        return self

    @property
    def pair(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"

    def resolved_mirror(self) -> str:
        """``DATA_MIRROR`` from the environment, else ``data.mirror`` ("" = upstream)."""
        return os.environ.get("DATA_MIRROR", "") or self.mirror
