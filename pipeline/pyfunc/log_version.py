"""Logging the translator's pyfunc model (``pipeline.serving.mlflow_model``) into the evaluate stage's
MLflow run and registering it with its model card: the averaged checkpoint, the tokenizer and the
CTranslate2 export as artifacts, the code loading it runs (``pipeline.pyfunc.model_code``) as
``code_paths``, and the model object as code (``pipeline.pyfunc.mlflow_model_code``, MLflow's models
from code): nothing of a version is pickled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd

from pipeline.serving.mlflow_model import CT2_ARTIFACT, TranslatorModel

# sacremoses: a model of the literature's text form (pipeline.text.forms) prepares its input and output with it.
PIP_REQUIREMENTS_OF = ("torch", "numpy", "sentencepiece", "pandas", "mlflow", "sacremoses")

if TYPE_CHECKING:
    from pipeline.config.decoding import DecodingConfig


def _pins(engine: str = "torch") -> list[str]:
    """The pyfunc model's pip requirements: the installed versions (requirements.txt's pins), and
    CTranslate2 where the version decodes with it."""
    from importlib.metadata import version

    names = (*PIP_REQUIREMENTS_OF, *(("ctranslate2",) if engine == "ctranslate2" else ()))
    return [f"{name}=={version(name).split('+')[0]}" for name in names]


def _run_decoding(run_id: str, chosen: Mapping[str, Any]) -> tuple[DecodingConfig, dict[str, str]]:
    """The decoding settings to register: the tuned ones (``TUNED``) as ``chosen``, the rest from
    the run's ``evaluate.*`` params (the paper's defaults where the run has none); and where each
    tuned one came from (``chosen``'s ``<key>_from``, else the evaluate stage's ``decoding.<key>_from``
    tags, else ``params``)."""
    from pipeline.config.decoding import TUNED, DecodingConfig
    from pipeline.tracking.store import client

    run = client().get_run(run_id)
    p, t = run.data.params, run.data.tags
    settings = {k.removeprefix("evaluate."): v for k, v in p.items() if k.startswith("evaluate.")}
    parsed = {}
    for key, value in settings.items():
        try:
            parsed[key] = None if value == "None" else json.loads(value)   # a null param is logged as None
        except ValueError:
            parsed[key] = value    # a plain string (precision: fp32)
    decoding = DecodingConfig.of({**parsed, **{k: chosen[k] for k in TUNED if chosen.get(k) is not None}})
    sources = {k: chosen.get(f"{k}_from") or t.get(f"decoding.{k}_from", "params") for k in TUNED}
    return decoding, sources


def _named(folder: Path, scratch: Path) -> Path:
    """``folder``, or a copy of it in ``scratch`` named ``CT2_ARTIFACT``: MLflow keeps an artifact
    under its source's own name, and a version's folder is ``artifacts/ctranslate2/`` whatever the
    source was called (a record kept in the unsent queue, a test's folder)."""
    if folder.name == CT2_ARTIFACT:
        return folder
    import shutil

    return Path(shutil.copytree(folder, scratch / CT2_ARTIFACT))


@contextlib.contextmanager
def _mlflow_warnings_only() -> Iterator[None]:
    """MLflow's own INFO lines ("Validating input example against model signature") held back while
    the model is logged: the stage and ``make push`` print our lines; MLflow's warnings still show."""
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def log_translator(run_id: str, model_file: Path, tokenizer_file: Path, registered_name: str,
                   chosen: Mapping[str, Any], *, metrics_file: Path | None = None,
                   corpus_stats_file: Path | None = None, ct2_model: Path | None = None) -> str | None:
    """Log the pyfunc model into ``run_id``, register it (unless ``registered_name`` is "": a sweep's
    point, whose run then holds ``UNREGISTERED_TAG``) with its model card (description and tags,
    ``pipeline.tracking.model_card.register_version``); returns the new registry version, or the
    version that already holds the same model file of the same run with the same settings (nothing
    logged or registered again).

    ``chosen``: the tuned settings the evaluate stage decoded with (``ChosenDecoding.as_dict()``: beam
    size, alpha, stopping rule, engine, compute type and, optionally, where each came from); the other
    settings are the run's ``evaluate.*`` params. ``metrics_file`` (default ``reports/evaluate/scores.json``)
    holds the test scores and signatures, ``corpus_stats_file`` (default ``data/corpus/stats.json``) the
    data cleaning counts, ``ct2_model`` the export stage's folder (the ``ctranslate2`` artifact, logged
    whatever the engine, so that the version can be served with either; none: the version has none).
    """
    from mlflow.models import infer_signature

    from pipeline.config import paths
    from pipeline.pyfunc import mlflow_model_code, model_code
    from pipeline.scoring.reports import EVALUATE_SCORES
    from pipeline.serving.registered import to_register
    from pipeline.tracking import model_card
    from transformer.atomic import file_sha256

    settings, sources = _run_decoding(run_id, chosen)
    model_config, defaults = to_register(settings)   # one DecodingConfig: the two always agree
    identity = model_card.identity_tags(file_sha256(model_file), model_config["decoding"])
    existing = registered_name and model_card.existing_version(registered_name, run_id, identity)
    if existing:   # a forced re-evaluation, or a retry after the registration's answer was lost
        print(f"MLflow: {registered_name!r} version {existing} already holds this model (sha256 "
              f"{identity[model_card.MODEL_SHA_TAG][:12]}) of run {run_id} with these decoding settings; "
              "not registered again", flush=True)
        return existing
    decoding = {**model_config["decoding"], **{f"{k}_from": v for k, v in sources.items()}}
    example = pd.DataFrame({"text": ["A man is walking."]})
    signature = infer_signature(example, ["Ein Mann geht."], params=defaults)
    artifacts = {"model": str(model_file), "tokenizer": str(tokenizer_file)}
    with tempfile.TemporaryDirectory(prefix="model-code-") as code, \
            tempfile.TemporaryDirectory(prefix="model-export-") as scratch, _mlflow_warnings_only(), \
            mlflow.start_run(run_id=run_id):
        if ct2_model is not None and Path(ct2_model).is_dir():
            artifacts[CT2_ARTIFACT] = str(_named(Path(ct2_model), Path(scratch)))
        info = mlflow.pyfunc.log_model(
            name="translator", python_model=mlflow_model_code.__file__,   # as code: nothing pickled
            artifacts=artifacts,
            code_paths=model_code.stage(TranslatorModel.__module__, TranslatorModel.__name__, Path(code)),
            pip_requirements=_pins(settings.engine), signature=signature, input_example=example,
            model_config=model_config,
        )

    if not registered_name:   # a sweep's point: what registering it later needs stays with its run
        pending = {"model_uri": info.model_uri, "identity": identity, "decoding": decoding}
        mlflow.MlflowClient().set_tag(run_id, UNREGISTERED_TAG, json.dumps(pending, sort_keys=True))
        print(f"MLflow: model logged into run {run_id}, not registered (a sweep's point: `make sweep-apply` "
              "registers the sweep's winner)", flush=True)
        return ""
    version = model_card.register_version(registered_name, info.model_uri, run_id, identity,
                                          **card_inputs(model_file, decoding, metrics_file or EVALUATE_SCORES,
                                                        corpus_stats_file or paths.CORPUS_DIR / "stats.json"))
    print(f"MLflow: registered model {registered_name!r} version {version} (run {run_id})", flush=True)
    return version


# The tag on a run whose model was logged but not registered (a sweep's point): its model URI,
# identity tags and decoding settings as JSON, what ``register_logged`` registers later.
UNREGISTERED_TAG = "translator.unregistered"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def card_inputs(model_file: Path, decoding: Mapping[str, Any], metrics_file: Path,
                corpus_stats_file: Path) -> dict[str, Any]:
    """The model card's inputs besides its run (``model_card.model_card``'s keyword arguments)."""
    from transformer.checkpoint import load_checkpoint

    return {"metrics": _read_json(metrics_file), "decoding": dict(decoding),
            "model_config": load_checkpoint(model_file).get("model_config", {}),
            "corpus_stats": _read_json(corpus_stats_file)}


def register_logged(run_id: str, registered_name: str, model_file: Path, metrics_file: Path,
                    corpus_stats_file: Path) -> str:
    """Register the model a sweep's point logged into ``run_id`` unregistered (``UNREGISTERED_TAG``)
    as a version of ``registered_name``, with its model card (the run's ``sweep`` tags are its
    lineage); ``model_file`` (whose sha256 must be the logged one's), ``metrics_file`` and
    ``corpus_stats_file`` are the point's, as ``dvc exp apply`` restored them. Returns the version
    (the one that already holds it, when registered before)."""
    from pipeline.tracking import model_card
    from transformer.atomic import file_sha256

    tag = mlflow.MlflowClient().get_run(run_id).data.tags.get(UNREGISTERED_TAG)
    if not tag:
        raise ValueError(f"run {run_id} has no unregistered model (tag {UNREGISTERED_TAG}): it is no sweep's point "
                         "or its evaluate stage did not finish")
    pending = json.loads(tag)
    identity = pending["identity"]
    if file_sha256(model_file) != identity[model_card.MODEL_SHA_TAG]:
        raise ValueError(f"{model_file} is not the model run {run_id} logged (sha256 differs): apply that "
                         "run's experiment first")
    existing = model_card.existing_version(registered_name, run_id, identity)
    if existing:
        return existing
    return model_card.register_version(registered_name, pending["model_uri"], run_id, identity,
                                       **card_inputs(model_file, pending["decoding"], metrics_file,
                                                     corpus_stats_file))
