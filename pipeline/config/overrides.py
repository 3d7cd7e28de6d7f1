"""``section.key=value`` overrides, the one way they are read and applied (as ``dvc exp run -S``
applies them to params.yaml), and written back as ``-S`` arguments for DVC (Hydra's override
grammar, which DVC parses)."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.errors import ParamsError

_PLAIN = re.compile(r"^[A-Za-z_][\w\-./]*$")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "-inf"}


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["train.max_steps=100", ...]`` -> ``{"train.max_steps": 100}``: each value read as YAML, as
    ``dvc exp run -S`` reads it."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not (sep and dot and section and name):
            raise ParamsError(f"override {item!r} is not section.key=value (e.g. train.max_steps=100)")
        try:
            parsed[key] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError:
            raise ParamsError(f"override {item!r}: the value is not valid YAML") from None
    return parsed


def with_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any] | Iterable[str]) -> dict[str, Any]:
    """``raw`` (params.yaml's mapping) with ``overrides`` applied, key by key: ``{"section.key":
    value}`` or ``["section.key=value", ...]`` (a copy; ``raw`` is left as it was)."""
    if not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    merged = {name: dict(section) if isinstance(section, dict) else section for name, section in raw.items()}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if not isinstance(merged.get(section), dict):
            merged[section] = {}
        merged[section][name] = value
    return merged


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar, which ``dvc exp run -S`` parses: a list as
    ``[a,b]``, a string quoted unless plain (a bare comma would make a sweep of it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _HYDRA_WORDS:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def set_param(key: str, values: list[Any], raw: Mapping[str, Any]) -> str:
    """One ``-S`` argument: ``key=a,b,c`` (DVC's grid syntax) or ``key=a``; ``+key`` when params.yaml
    lacks the key (a model field the preset sets), as Hydra requires for a new key."""
    section, name = key.split(".", 1)
    prefix = "" if isinstance(raw.get(section), dict) and name in raw[section] else "+"
    return f"{prefix}{key}=" + ",".join(hydra_value(v) for v in values)


def dvc_executable() -> str:
    """The ``dvc`` beside this Python (the project's virtual environment), else the one on PATH."""
    beside = Path(sys.executable).parent / "dvc"
    return str(beside) if beside.is_file() else (shutil.which("dvc") or "dvc")
