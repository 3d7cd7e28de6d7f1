"""Reading ``params.yaml`` once, and validating just the sections a caller asks for.

A stage passes the section models it reads (``load_sections(DataParams, TokenizerParams)``), so it
imports, and DVC makes it depend on, only their code: editing the model's configuration reruns
training, never the download. The file's own problems (missing, not YAML, not a mapping, an unknown
section) are refused whichever sections are asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from pipeline.config.errors import ParamsError

PARAMS = Path("params.yaml")   # the file DVC hashes, at the repository root (DVC runs stages there)
SECTION_NAMES = ("data", "tokenizer", "model", "train", "average", "tune", "evaluate", "tracking", "flows")


class SectionSpec(Protocol):
    """A section model (``pipeline.config.section.Section``): its name and how it loads."""

    SECTION: str

    @classmethod
    def load(cls, values: Mapping[str, Any]) -> Any: ...


def read_params(path: str | Path = PARAMS) -> dict[str, Any]:
    """``path``'s mapping of sections, unvalidated; ``ParamsError`` if it is missing, not YAML or not
    a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        reason = getattr(err, "problem", None) or " ".join(str(err).split())
        raise ParamsError(f"params.yaml is not valid YAML{where}: {reason}") from None
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping of sections")
    return raw


def check_section_names(raw: Mapping[str, Any]) -> None:
    unknown = sorted(str(name) for name in set(raw) - set(SECTION_NAMES))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]} (known: {', '.join(SECTION_NAMES)})")


def load_section(spec: SectionSpec, raw: Mapping[str, Any]) -> Any:
    """One section of ``raw`` (absent or null: every key's default) as ``spec`` loads it; its
    ``ParamsError`` says which file."""
    values = raw.get(spec.SECTION)
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ParamsError(f"params.yaml: section {spec.SECTION} must be a mapping, got {values!r}")
    try:
        return spec.load(values)
    except ParamsError as err:
        raise ParamsError(f"params.yaml: {err}") from None


class Sections:
    """The sections a caller loaded, by name (``params.data``, ``params.train``), and the file's
    mapping (``raw``: every section, as written) for tracking."""

    def __init__(self, raw: dict[str, Any], sections: Mapping[str, Any]) -> None:
        self.raw = raw
        self._sections = dict(sections)

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("_sections", {})
        if name in sections:
            return sections[name]
        if name in SECTION_NAMES:
            raise AttributeError(f"section {name} was not loaded: pass its model to load_sections")
        raise AttributeError(name)

    def flat(self) -> dict[str, Any]:
        """Every key of the file as a dotted name, for tracking (``train.max_tokens`` -> 4096)."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else str(k), v)
            else:
                out[prefix] = value
        walk("", self.raw)
        return out


def load_sections(*specs: SectionSpec, path: str | Path = PARAMS, raw: dict[str, Any] | None = None) -> Sections:
    """Read ``path`` (or take ``raw``, its mapping) and validate the sections of ``specs`` only."""
    if raw is None:
        raw = read_params(path)
    check_section_names(raw)
    return Sections(raw, {spec.SECTION: load_section(spec, raw) for spec in specs})
