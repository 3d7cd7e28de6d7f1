"""The base of every params.yaml section model, and the one translation of a pydantic
``ValidationError`` into the one-line form ``train.max_tokens must be a positive integer, got -5``.

Sections are strict: an int is accepted where a float is expected (and becomes a float), nothing
else is coerced (a bool is not an int, a string is not a number). Unknown keys are refused.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from pipeline.config.errors import ParamsError

# pydantic's type errors, as params.yaml's messages phrase them.
TYPE_PHRASES = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
}
MAPPING_ERRORS = ("model_type", "dict_type", "model_attributes_type")


def invalid(message: str) -> PydanticCustomError:
    """The error a section's validator raises: ``message`` as it reads after the key's dotted path
    (a field validator: ``must be positive, got 0``) or whole (a model validator, whose error has
    no key: ``data.src_lang and data.tgt_lang are both 'en'``)."""
    return PydanticCustomError("params", "{message}", {"message": message})


def dotted(section: str, loc: tuple[int | str, ...]) -> str:
    """``("alphas", 1)`` in section ``tune`` -> ``tune.alphas[1]``."""
    key = section
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


def one_line(err: ValidationError, section: str, known: list[str]) -> str:
    """The first problem of ``err`` (an unknown key first, as a typo is the likelier cause of what
    follows) as one line naming the key; ``known`` lists the section's keys for an unknown one."""
    errors: list[ErrorDetails] = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    kind, loc, given = first["type"], first["loc"], first.get("input")
    key = dotted(section, loc)
    if kind == "extra_forbidden":
        return f"unknown key {key} (known: {', '.join(known)})"
    if kind in MAPPING_ERRORS and not loc:
        return f"section {section} must be a mapping, got {given!r}"
    if kind in TYPE_PHRASES:
        return f"{key} {TYPE_PHRASES[kind]}, got {given!r}"
    if kind == "params":
        return f"{key} {first['msg']}" if loc else first["msg"]
    return f"{key}: {first['msg']}"   # a pydantic check no validator here phrases (none today)


class Section(BaseModel):
    """A params.yaml section. ``SECTION`` is its name there; ``load`` turns the section's mapping
    into what stages use (this model, or a package dataclass built from it) and raises
    ``ParamsError`` with one line naming the key. Built directly (``DataParams(test_sets=[...])``),
    a bad value raises the same ``ParamsError`` line."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    SECTION: ClassVar[str]

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ParamsError(one_line(err, self.SECTION, list(type(self).model_fields))) from None

    @classmethod
    def validate_section(cls, values: Mapping[str, Any]) -> Any:
        """``values`` (the section's mapping) validated into this model."""
        odd = [key for key in values if not isinstance(key, str)]
        if odd:   # a YAML key that is not a string (``1: x``) names no field
            raise ParamsError(f"unknown key {cls.SECTION}.{odd[0]} (known: {', '.join(cls.model_fields)})")
        return cls(**values)   # through __init__, which words the error (model_validate would wrap it)

    @classmethod
    def load(cls, values: Mapping[str, Any]) -> Any:
        """What the stages use for this section: the validated model (a section built from a
        package dataclass returns that dataclass)."""
        return cls.validate_section(values)


def package_message(err: Exception, cls: type, section: str) -> str:
    """The message of a ``transformer`` dataclass's check, which names its fields as
    ``ModelConfig.d_model``, with each of its fields named as the params.yaml key (``model.d_model``):
    the package knows nothing of params.yaml (``transformer/`` never imports the pipeline)."""
    message = " ".join(str(err).split())   # one line
    for f in dataclasses.fields(cls):
        message = re.sub(rf"\b{cls.__name__}\.{f.name}\b", f"{section}.{f.name}", message)
    return message


def dataclass_fields(cls: type, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """``cls``'s fields as ``create_model`` takes them: (type, default), a field without a default
    as required."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in leave_out:
            continue
        default = f.default if f.default is not dataclasses.MISSING else ...
        out[f.name] = (hints[f.name], default)
    return out
