"""Which registered version the server serves, and loading it: the registry's ``champion`` of the
model (without one, the newest version: followed as new versions arrive), its ``model.pt`` and
SentencePiece model downloaded from whatever store ``MLFLOW_TRACKING_URI`` names and loaded
directly, decoding with the settings the evaluate stage scored (the version's registered settings,
``pipeline.serving.registered``), warmed with one translation before it serves."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient

from pipeline.serving.mlflow_server import served_version
from pipeline.serving.registered import mlmodel_settings
from pipeline.serving.translator import Translator, load_translator

WARM_UP_SENTENCE = "A man is walking."


@dataclass
class ServedModel:
    name: str
    version: str
    why: str             # "alias champion", or why the latest is served
    run_id: str
    translator: Translator = field(repr=False)
    loaded_at: float = field(default_factory=time.time)

    def describe(self) -> dict[str, str]:
        alias = "champion" if self.why.startswith("alias") else ""
        return {"name": self.name, "version": self.version, "alias": alias, "run_id": self.run_id, "source": self.why}


def wanted_version(client: MlflowClient, name: str) -> tuple[str, str, str]:
    """(version, why, run id) the registry says to serve now."""
    version, why = served_version(client, name)
    return str(version.version), why, version.run_id


def load_version(tracking_uri: str, name: str, version: str, why: str, run_id: str,
                 device: str = "cpu") -> ServedModel:
    """Download the version's ``MLmodel`` and its artifacts (the checkpoint and the tokenizer; not
    the bundled code), load its translator and translate one sentence with it."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    source = MlflowClient(tracking_uri, tracking_uri).get_model_version_download_uri(name, version).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="served-model-") as tmp:
        def fetch(path: str) -> Path:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{source}/{path}", dst_path=tmp,
                                                            tracking_uri=tracking_uri))
        decoding = mlmodel_settings(fetch("MLmodel"))
        artifacts = fetch("artifacts")
        model_file = next(artifacts.glob("*.pt"))
        tokenizer_file = next(artifacts.glob("*.model"))
        # The checkpoint is read into memory (weights_only) and the tokenizer's bytes too: the
        # temporary folder may go once loaded.
        translator = load_translator(model_file, tokenizer_file, decoding, device=device,
                                     model_source=f"models:/{name}/{version}")
    with torch.inference_mode():
        translator.translate([WARM_UP_SENTENCE])
    return ServedModel(name, version, why, run_id, translator)
