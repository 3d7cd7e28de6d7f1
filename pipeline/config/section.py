"""The base of every params.yaml section model, and the one translation of a pydantic
``ValidationError`` into the one-line form ``train.max_tokens must be a positive integer, got -5``.

Sections are strict: an int is accepted where a float is expected (and becomes a float), nothing
else is coerced (a bool is not an int, a string is not a number). Unknown keys are refused. A
field's limits are declared where pydantic has a word for them (``Annotated[int, Field(gt=0)]``,
``Literal[...]``), and their errors read as a validator's would (``must be positive, got 0``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

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
BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


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


def _number(value: float) -> str:
    """A bound as params.yaml writes it: ``0.9``, ``1`` (not ``1.0``), ``1000000`` (not ``1e+06``)."""
    return str(int(value)) if float(value).is_integer() else str(value)


def bounds(metadata: list[Any]) -> str:
    """What a number field's declared constraints (``Field(gt=0)``, ``Field(ge=0.9, le=1)``) say it
    must be: ``must be positive``, ``must be >= 0``, ``must be at least 16``, ``must be in [0.9, 1]``."""
    def bound(name: str) -> Any:
        return next((getattr(m, name) for m in metadata if getattr(m, name, None) is not None), None)
    ge, gt, le, lt = bound("ge"), bound("gt"), bound("le"), bound("lt")
    low, high = (gt if ge is None else ge), (lt if le is None else le)
    if low is not None and high is not None:
        return f"must be in {'(' if ge is None else '['}{_number(low)}, {_number(high)}{')' if le is None else ']'}"
    if low is None:
        return f"must be {'<' if le is None else '<='} {_number(high)}"
    if ge is None:
        return "must be positive" if gt == 0 else f"must be greater than {_number(gt)}"
    return "must be >= 0" if ge == 0 else f"must be at least {_number(ge)}"


def constraint(error: ErrorDetails, model: type[BaseModel]) -> str | None:
    """A declared constraint's error in params.yaml's words (``must be positive, got 0``;
    ``must be one of scratch, finetune, got 'continue'``), or None for another error. The value is
    shown as the field holds it (an integer given for a float: ``got 1.0``)."""
    field = model.model_fields.get(str(error["loc"][0])) if len(error["loc"]) == 1 else None
    if field is None:
        return None
    given = error.get("input")
    if error["type"] in BOUND_ERRORS:
        if field.annotation is float and isinstance(given, int) and not isinstance(given, bool):
            given = float(given)
        return f"{bounds(field.metadata)}, got {given}"
    if error["type"] == "literal_error" and typing.get_origin(field.annotation) is Literal:
        if not isinstance(given, str):
            return f"{TYPE_PHRASES['string_type']}, got {given!r}"
        return f"must be one of {', '.join(map(str, typing.get_args(field.annotation)))}, got {given!r}"
    return None


def one_line(err: ValidationError, model: type[Section]) -> str:
    """The first problem of ``err`` (an unknown key first, as a typo is the likelier cause of what
    follows) as one line naming the key in ``model``'s section; an unknown key's line lists the
    section's keys."""
    errors: list[ErrorDetails] = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    kind, loc, given = first["type"], first["loc"], first.get("input")
    key = dotted(model.SECTION, loc)
    if kind == "extra_forbidden":
        return f"unknown key {key} (known: {', '.join(model.model_fields)})"
    declared = constraint(first, model)
    if declared:
        return f"{key} {declared}"
    if kind in MAPPING_ERRORS and not loc:
        return f"section {model.SECTION} must be a mapping, got {given!r}"
    if kind in TYPE_PHRASES:
        return f"{key} {TYPE_PHRASES[kind]}, got {given!r}"
    if kind == "params":
        return f"{key} {first['msg']}" if loc else first["msg"]
    return f"{key}: {first['msg']}"   # a pydantic check nothing here phrases (none today)


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
            raise ParamsError(one_line(err, type(self))) from None

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
