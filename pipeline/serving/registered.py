"""A registered version's decoding settings (§6.1): written in one place, read by one function.

Written by ``pipeline.pyfunc.log_version.log_translator`` from one ``DecodingConfig``
(``to_register``): the ``model_config``'s ``decoding`` holds every setting and is the source of
truth; the signature's params hold the settings a request may set (``REQUEST``), with the same
values as defaults, because MLflow's scoring server fills a request's missing params from them.
Both servers therefore decode a request alike.

Read by ``registered_settings`` (the server, the promotion gate, the pyfunc model): the
``model_config``'s settings; the signature's defaults only for versions logged before the
``model_config`` carried them; a setting a version records nothing of is the value it was decoded
and scored with before the setting existed (``Rule.legacy``: the exact stopping rule, the torch
engine: such a version has no ``ctranslate2`` artifact).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.decoding import LEGACY, RULES, DecodingConfig, typed


class SettingsNotRecorded(ValueError):
    """A version records no decoding settings: not a model the evaluate stage logged."""


def to_register(decoding: DecodingConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the pyfunc ``model_config``, the signature's params with their defaults) of ``decoding``:
    the one place a version's settings are written, so the two always agree."""
    settings = {name: typed(name, value) for name, value in decoding.to_dict().items()}
    return {"decoding": settings}, {name: settings[name] for name in decoding.per_request()}


def registered_settings(model_config: Mapping[str, Any] | None,
                        signature_params: Mapping[str, Any] | None = None) -> DecodingConfig:
    """The settings a version decodes with, from its ``model_config`` (the source of truth) or,
    for versions logged before it carried them, its signature's param defaults.

    Raises ``SettingsNotRecorded`` when neither records any, ``ValueError`` for recorded settings
    that are not valid ones."""
    recorded = (model_config or {}).get("decoding") or signature_params or {}
    if not recorded:
        raise SettingsNotRecorded("records no decoding settings (neither in its model_config nor as its "
                                  "signature's params): not a model logged by the evaluate stage")
    # Unknown keys are left out: a version registered by a later code (a setting this one lacks).
    return DecodingConfig.of({**LEGACY, **{k: typed(k, v) for k, v in recorded.items() if k in RULES}})


def mlmodel_settings(mlmodel: str | os.PathLike | Mapping[str, Any]) -> DecodingConfig:
    """``registered_settings`` of a downloaded version: its ``MLmodel`` file (or the file's contents
    as parsed YAML)."""
    from mlflow.models.model import MODEL_CONFIG
    from mlflow.models.signature import ModelSignature

    meta = mlmodel if isinstance(mlmodel, Mapping) else (yaml.safe_load(Path(mlmodel).read_text()) or {})
    pyfunc = (meta.get("flavors") or {}).get("python_function") or {}
    model_config = pyfunc.get(MODEL_CONFIG)   # the pyfunc flavor's "config": what load_context receives
    signature_params: dict[str, Any] = {}
    if (meta.get("signature") or {}).get("params"):
        schema = ModelSignature.from_dict(meta["signature"]).params
        signature_params = {p.name: p.default for p in schema.params} if schema else {}
    return registered_settings(model_config, signature_params)
