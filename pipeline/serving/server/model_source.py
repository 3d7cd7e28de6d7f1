"""Which registered version the server serves, and loading it: the registry's ``champion`` of the
model (without one, the newest version: followed as new versions arrive), its files downloaded from
whatever store ``MLFLOW_TRACKING_URI`` names and loaded directly, decoding with the settings the
evaluate stage scored (the version's registered settings, ``pipeline.serving.registered``) by the
version's engine (``pipeline.serving.engine``: its ``ctranslate2`` export where it has one, else our
search), warmed with one translation before it serves."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import torch
from mlflow.tracking import MlflowClient

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.ct2_translator import CT2Translator
from pipeline.serving.ct2_translator import default_threads as ct2_default_threads
from pipeline.serving.engine import AnyTranslator, load_engine_translator
from pipeline.serving.mlflow_server import served_version
from pipeline.serving.registered import mlmodel_settings

WARM_UP_SENTENCE = "A man is walking."
CT2_ARTIFACT = "ctranslate2"   # the export stage's model, as the registered version carries it


@dataclass
class ServedModel:
    name: str
    version: str
    why: str             # "alias champion", or why the latest is served
    run_id: str
    translator: AnyTranslator = field(repr=False)
    loaded_at: float = field(default_factory=time.time)
    threads: tuple[int, int] | None = None   # CTranslate2's (inter, intra) as asked (None: its loader's default)
    requests: int = field(default=0, repr=False)   # accepted, not yet answered (counted on the event loop)

    @property
    def engine(self) -> str:
        """Who decodes: the version's engine, or torch where CTranslate2 could not load it."""
        return "ctranslate2" if isinstance(self.translator, CT2Translator) else "torch"

    @property
    def concurrency(self) -> int:
        """Batches it decodes at once: CTranslate2's replicas (``inter_threads``); one for our search,
        whose parallelism is torch's intra-op threads."""
        return self.translator.engine.num_translators if isinstance(self.translator, CT2Translator) else 1

    @property
    def label(self) -> str:
        """The engine in a few words: ``torch``, ``ctranslate2 int8 (2 replicas x 1 thread)``."""
        if not isinstance(self.translator, CT2Translator):
            return "torch"
        inter, intra = self.threads or ct2_default_threads()
        return f"ctranslate2 {self.translator.decoding.compute_type} ({inter} x {intra} threads)"

    def describe(self) -> dict[str, str]:
        alias = "champion" if self.why.startswith("alias") else ""
        described = {"name": self.name, "version": self.version, "alias": alias, "run_id": self.run_id,
                     "source": self.why, "engine": self.engine}
        if isinstance(self.translator, CT2Translator):
            described["compute_type"] = self.translator.decoding.compute_type
            described["threads"] = "{} x {}".format(*(self.threads or ct2_default_threads()))
        return described

    def release(self) -> None:
        """Free the engine's memory now (a swapped-out version, once drained), not when the last
        reference goes: CTranslate2 holds its weights and its replicas' buffers outside Python."""
        if isinstance(self.translator, CT2Translator):
            self.translator.engine.unload_model()


def wanted_version(client: MlflowClient, name: str) -> tuple[str, str, str]:
    """(version, why, run id) the registry says to serve now."""
    version, why = served_version(client, name)
    return str(version.version), why, version.run_id


def served_settings(decoding: DecodingConfig, engine: str | None) -> DecodingConfig:
    """The version's settings, with ``engine`` forced when given (a comparison: ``--engine``).
    CTranslate2 has one stopping rule, fairseq's: forcing it on a version scored with the exact
    rule decodes with fairseq's (said on stderr)."""
    if engine is None or engine == decoding.engine:
        return decoding
    if engine == "ctranslate2" and decoding.stopping == "exact":
        print("warning: ctranslate2 forced on a version scored with the exact stopping rule: decoding with "
              "fairseq's (CTranslate2's only rule)", file=sys.stderr, flush=True)
        return decoding.replace(engine=engine, stopping="fairseq")
    return decoding.replace(engine=engine)


def load_version(tracking_uri: str, name: str, version: str, why: str, run_id: str, device: str = "cpu",
                 threads: tuple[int, int] | None = None, engine: str | None = None) -> ServedModel:
    """Download the version's ``MLmodel`` and its artifacts (the checkpoint, the tokenizer and, when
    exported, the CTranslate2 model; not the bundled code), load the translator of its engine
    (``engine`` forces one) and translate one sentence with it. ``threads``: CTranslate2's
    (inter_threads, intra_threads)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    source = MlflowClient(tracking_uri, tracking_uri).get_model_version_download_uri(name, version).rstrip("/")
    with tempfile.TemporaryDirectory(prefix="served-model-") as tmp:
        def fetch(path: str) -> Path:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{source}/{path}", dst_path=tmp,
                                                            tracking_uri=tracking_uri))
        decoding = served_settings(mlmodel_settings(fetch("MLmodel")), engine)
        artifacts = fetch("artifacts")
        model_file = next(artifacts.glob("*.pt"))
        tokenizer_file = next(artifacts.glob("*.model"))
        exported = artifacts / CT2_ARTIFACT
        # Everything is read into memory here, so the temporary folder may go once loaded: the
        # checkpoint (weights_only), the tokenizer's bytes, and CTranslate2's model.bin and
        # vocabulary, which ctranslate2.Translator reads whole when built (it reads the directory
        # again only in load_model after an unload_model, which the server never calls on a served
        # version; tests/pipeline/serving/test_server_engines.py serves after the folder is gone).
        translator = load_engine_translator(model_file, tokenizer_file, decoding,
                                            ct2_model=exported if exported.is_dir() else None, device=device,
                                            model_source=f"models:/{name}/{version}", threads=threads)
    with torch.inference_mode():
        translator.translate([WARM_UP_SENTENCE])
    return ServedModel(name, version, why, run_id, translator, threads=threads)
