"""The ``model`` section: a preset name plus overrides of any ``ModelConfig`` field (§3, Table 3),
checked by the package's own ``ModelConfig``; vocab_size comes from the tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import create_model, field_validator

from pipeline.config.errors import ParamsError
from pipeline.config.section import Section, dataclass_fields, invalid, package_message
from transformer.config import PRESETS, ConfigError, ModelConfig, build_config


@dataclass(frozen=True)
class ModelParams:
    """A preset name plus overrides of any ``ModelConfig`` field, as params.yaml gives them."""

    preset: str = "laptop"
    overrides: dict[str, Any] = field(default_factory=dict)

    def config(self, vocab_size: int) -> ModelConfig:
        try:
            return build_config(self.preset, vocab_size, **self.overrides)
        except ConfigError as err:
            raise ParamsError(f"params.yaml: {package_message(err, ModelConfig, 'model')}") from None


# Every ModelConfig field but vocab_size, typed as the dataclass types it; a key left out keeps the
# preset's value (the None default is never validated, and never used: see ModelSection.load).
_Keys = create_model("_Keys", __base__=Section,
                     **{name: (hint, None) for name, (hint, _) in
                        dataclass_fields(ModelConfig, leave_out=("vocab_size",)).items()})


class ModelSection(_Keys):   # type: ignore[misc,valid-type]
    SECTION = "model"

    preset: str = "laptop"

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise invalid(f"{value!r} does not exist; choose one of {sorted(PRESETS)}")
        return value

    @classmethod
    def load(cls, values: Mapping[str, Any]) -> ModelParams:
        """The keys' types checked here, their values by ``ModelConfig`` (the preset with the
        overrides, at a vocabulary size any pad_id fits). The overrides are kept as written: an
        int dropout stays an int in the checkpoint's config, as it always was."""
        cls.validate_section(values)
        overrides = {k: v for k, v in values.items() if k != "preset"}
        params = ModelParams(values.get("preset", "laptop"), overrides)
        try:
            build_config(params.preset, max(16, overrides.get("pad_id", 0) + 1), **overrides)
        except ConfigError as err:
            raise ParamsError(package_message(err, ModelConfig, "model")) from None
        return params
