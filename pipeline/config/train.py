"""The ``train`` section: the training hyper-parameters (§5), checked by the package's own
``TrainConfig``; the number of processes the stage launches (the pipeline's own key, which the
package never sees: a ``Trainer`` reads its world from the process group); and fine-tuning's input
files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import create_model, field_validator

from pipeline.config.errors import ParamsError
from pipeline.config.section import Section, dataclass_fields, invalid, package_message
from pipeline.config.tokenizer import TokenizerParams
from transformer.training.train_config import TrainConfig

# Every TrainConfig field, typed and defaulted as the dataclass.
_Keys = create_model("_Keys", __base__=Section, **dataclass_fields(TrainConfig))


class TrainSection(_Keys):   # type: ignore[misc,valid-type]
    """``processes``: how many training processes the stage starts on this host (§5.2: the paper's
    8 GPUs of one machine), ``auto`` for one per visible GPU (one on a machine without). Not a
    ``TrainConfig`` field: the launcher is the pipeline's (``pipeline.stages.launch``)."""

    SECTION = "train"

    processes: int | str = 1

    @field_validator("processes", mode="before")
    @classmethod
    def _processes(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise invalid(f"must be a positive integer or auto, got {value!r}")

    @classmethod
    def load(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The keys' types checked here, their values by ``TrainConfig``, which the stage trains with."""
        keys = cls.validate_section(values)
        try:
            return TrainConfig(**{f.name: getattr(keys, f.name) for f in fields(TrainConfig)})
        except ValueError as err:
            raise ParamsError(package_message(err, TrainConfig, "train")) from None

    @classmethod
    def requested_processes(cls, values: Mapping[str, Any]) -> int | str:
        """``train.processes`` of the section's mapping (validated alike): a count or ``auto``."""
        return cls.validate_section(values).processes


def check_init_files(train: TrainConfig, tokenizer: TokenizerParams, root: str | Path = ".") -> None:
    """Fine-tuning's inputs exist, and come as a pair: initial weights only make sense with the
    tokenizer they were trained with (their embedding rows are its pieces). Relative paths are
    relative to the repository root (``root``), where params.yaml is and DVC runs the stages."""
    root = Path(root)
    for key, value in (("train.init_from", train.init_from), ("tokenizer.model_from", tokenizer.model_from)):
        if value and not (root / value).is_file():
            where = "" if Path(value).is_absolute() else f" in {root.resolve()}"
            raise ParamsError(f"params.yaml: {key} {value} does not exist{where}")
    if train.init_from and not tokenizer.model_from:
        raise ParamsError(f"params.yaml: train.init_from is {train.init_from} but tokenizer.model_from is empty: "
                          "initial weights need the tokenizer they were trained with (set tokenizer.model_from)")
