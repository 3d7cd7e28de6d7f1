"""pipeline/serving/registered.py: a registered version's decoding settings are written once (the
model config, the source of truth, and the signature's param defaults, which agree) and read by one
function, the same for the server, the promotion gate and the pyfunc model; versions registered
before the model config carried them are read from their signature, and before the stopping rule
existed, with the exact rule. A version registered with the CTranslate2 engine carries the export
(``artifacts/ctranslate2/``) and decodes with it through the pyfunc model and the gate; one registered
before the engine was a setting decodes with torch. A version is logged as code and loads without
unpickling; one logged before that, pickled, still loads. Real MLflow: a tiny model registered in a
temporary SQLite store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.models import ModelSignature, infer_signature
from mlflow.pyfunc import PythonModelContext
from mlflow.tracking import MlflowClient
from mlflow.types.schema import ParamSchema, ParamSpec

from pipeline.config.decoding import RULES, DecodingConfig
from pipeline.flows import gate
from pipeline.pyfunc.log_version import log_translator
from pipeline.serving.ct2_translator import CT2Translator, load_ct2_translator
from pipeline.serving.export import export_ctranslate2
from pipeline.serving.mlflow_model import TranslatorModel
from pipeline.serving.registered import SettingsNotRecorded, mlmodel_settings, registered_settings, to_register
from pipeline.serving.server.model_source import load_version
from pipeline.serving.translator import Translator, load_translator
from transformer.checkpoint import load_model

from ..conftest import REPO
from .test_mlflow_server import NAME, SOURCES, registered_in_temp_store

pytestmark = pytest.mark.fast

# What the evaluate stage registered (beam 2 and alpha 0.6 chosen, max_len_b 12 from the run's params).
REGISTERED = DecodingConfig(beam_size=2, alpha=0.6, max_len_b=12, stopping="exact")
# Version 4: tune chose CTranslate2 at int8 (its own alpha and stopping rule).
WITH_CT2 = DecodingConfig(beam_size=2, alpha=1.0, max_len_b=12, stopping="fairseq", engine="ctranslate2",
                          compute_type="int8")


def signature_dict(**defaults) -> dict:
    """An MLmodel's ``signature`` entry whose params have these defaults."""
    dtypes = {int: "long", float: "double", str: "string"}
    params = ParamSchema([ParamSpec(k, dtypes[type(v)], v) for k, v in defaults.items()])
    return ModelSignature(params=params).to_dict()


def mlmodel(decoding: dict | None, **signature) -> dict:
    """An MLmodel file's contents: the pyfunc flavor's model_config and the signature."""
    pyfunc = {"loader_module": "mlflow.pyfunc.model"}
    if decoding is not None:
        pyfunc["config"] = {"decoding": decoding}   # where MLflow keeps a pyfunc model's model_config
    return {"flavors": {"python_function": pyfunc}, **({"signature": signature_dict(**signature)} if signature else {})}


def test_written_once_the_model_config_and_the_signature_agree():
    settings = DecodingConfig(beam_size=5, alpha=1, max_len_b=12, stopping="fairseq")
    model_config, params = to_register(settings)
    assert set(model_config["decoding"]) == set(RULES)             # every setting, so a new one travels too
    assert params == {"beam_size": 5, "alpha": 1.0, "stopping": "fairseq"} and isinstance(params["alpha"], float)
    assert registered_settings(model_config) == registered_settings(None, params).replace(max_len_b=12) == settings


def test_the_model_config_is_the_source_of_truth_the_signature_only_for_old_versions():
    new = mlmodel({**DecodingConfig(beam_size=5, alpha=1.5).to_dict(), "stopping": "fairseq"},
                  beam_size=3, alpha=0.6, stopping="exact")    # a disagreeing signature is not read
    assert mlmodel_settings(new) == DecodingConfig(beam_size=5, alpha=1.5, stopping="fairseq")
    # Registered before the stopping rule was a setting: model_config without it -> the exact rule
    before_rule = mlmodel({"beam_size": 4, "alpha": 1.0, "max_len_b": 8}, beam_size=4, alpha=1.0)
    assert mlmodel_settings(before_rule) == DecodingConfig(beam_size=4, alpha=1.0, max_len_b=8, stopping="exact")
    assert mlmodel_settings(before_rule).engine == "torch"   # before the engine was a setting: no export
    ct2 = DecodingConfig(beam_size=4, alpha=0.8, stopping="fairseq", engine="ctranslate2", compute_type="int8")
    assert mlmodel_settings(mlmodel(to_register(ct2)[0]["decoding"])) == ct2
    # Registered before model_config carried the settings: the signature's, the rest the paper's (§6.1)
    oldest = mlmodel(None, beam_size=3, alpha=2)
    assert mlmodel_settings(oldest) == DecodingConfig(beam_size=3, alpha=2.0, stopping="exact")
    with pytest.raises(SettingsNotRecorded, match="records no decoding settings"):
        mlmodel_settings(mlmodel(None))
    with pytest.raises(ValueError, match="DecodingConfig.stopping must be one of exact, fairseq, got 'soon'"):
        mlmodel_settings(mlmodel({"beam_size": 4, "stopping": "soon"}))
    # A setting this code does not know (a later one's) is left out.
    assert registered_settings({"decoding": {"beam_size": 6, "later": "x"}}).beam_size == 6


# ----------------------------------------------------------------------------- a real store


@dataclass
class Store:
    root: Path
    uri: str
    client: MlflowClient
    run_id: str
    model_file: Path
    tokenizer_file: Path
    ct2_model: Path


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    """Versions 1 and 2 as the evaluate stage registers them (torch); version 3 as versions were
    registered before the model config carried the settings and before the stopping rule and the
    engine: beam 3 and alpha 1.0 as its signature's params, nothing else, no export; version 4 as the
    evaluate stage registers a model whose tune stage chose CTranslate2 (``WITH_CT2``), with the
    export (from a folder of another name: the version's is ``ctranslate2`` whatever its source's)."""
    root, uri, run_id, model_file, tokenizer_file = registered_in_temp_store(tmp_path_factory, "registered")
    example = pd.DataFrame({"text": ["A man."]})     # versions carried an input example from the first
    signature = infer_signature(example, ["Ein Mann."], params={"beam_size": 3, "alpha": 1.0})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(root)
        mlflow.set_tracking_uri(uri)
        try:
            with mlflow.start_run(run_id=run_id):
                info = mlflow.pyfunc.log_model(name="old-translator", python_model=TranslatorModel(),
                                               artifacts={"model": str(model_file), "tokenizer": str(tokenizer_file)},
                                               signature=signature, input_example=example,
                                               registered_model_name=NAME)
            ct2_model = export_ctranslate2(load_model(model_file), tokenizer_file, root / "export-of-model")
            version = log_translator(run_id, model_file, tokenizer_file, NAME,
                                     {k: getattr(WITH_CT2, k) for k in ("beam_size", "alpha", "stopping", "engine",
                                                                        "compute_type")},
                                     metrics_file=root / "scores.json", corpus_stats_file=root / "missing-stats.json",
                                     ct2_model=ct2_model)
        finally:
            mlflow.set_tracking_uri(None)
    assert str(info.registered_model_version) == "3" and version == "4"
    return Store(root, uri, MlflowClient(uri, uri), run_id, model_file, tokenizer_file, Path(ct2_model))


def test_a_registered_version_records_one_set_of_settings(store, tmp_path):
    files = gate.version_files(store.client, NAME, "1", tmp_path, store.uri)
    assert mlmodel_settings(files["MLmodel"]) == REGISTERED
    model_config, params = to_register(REGISTERED)
    read = mlflow.models.Model.load(str(files["MLmodel"]))
    assert read.flavors["python_function"]["config"] == model_config
    assert {p.name: p.default for p in read.signature.params.params} == params   # what MLflow's server fills in


def test_server_gate_and_pyfunc_read_the_same_settings(store, tmp_path):
    mlmodels = {}
    for version, expected in (("1", REGISTERED), ("3", DecodingConfig(beam_size=3, alpha=1.0, stopping="exact"))):
        files = gate.version_files(store.client, NAME, version, tmp_path / version, store.uri)
        mlmodels[version] = files["MLmodel"]
        assert mlmodel_settings(files["MLmodel"]) == expected
        served = load_version(store.uri, NAME, version, "asked for", store.run_id)
        assert served.translator.decoding == expected                              # the server
        got, used = gate.translate_with_version(store.client, NAME, version, {"val": SOURCES}, None, None,
                                                max_len_b=12, batch_sentences=64, tracking_uri=store.uri)
        assert used == {**expected.per_request(), "engine": "torch", "compute_type": None,   # the gate
                        "text_form": "raw"}
        reference = load_translator(store.model_file, store.tokenizer_file, expected.replace(max_len_b=12),
                                    device="cpu")
        assert got["val"] == reference.translate(SOURCES)
    pyfunc = TranslatorModel()                                                     # the pyfunc model
    model_config = mlflow.models.Model.load(str(mlmodels["1"])).flavors["python_function"]["config"]
    pyfunc.load_context(PythonModelContext({"model": str(store.model_file), "tokenizer": str(store.tokenizer_file)},
                                           model_config))
    assert pyfunc.translator.decoding == REGISTERED
    assert pyfunc.decoding({"beam_size": 1}) == REGISTERED.replace(beam_size=1)
    assert pyfunc.predict(None, SOURCES) == load_translator(store.model_file, store.tokenizer_file, REGISTERED,
                                                            device="cpu").translate(SOURCES)


def requirements(files: dict) -> list[str]:
    return (files["MLmodel"].parent / "requirements.txt").read_text().split()


def test_the_gate_refuses_a_champion_of_another_text_form_before_translating(store, monkeypatch):
    """A raw champion against a challenger of the literature's form: one GateError, nothing decoded."""
    from pipeline.serving import engine

    monkeypatch.setattr(engine, "load_engine_translator", lambda *a, **k: pytest.fail("translated anyway"))
    with pytest.raises(gate.GateError, match=f"the champion \\({NAME} version 1\\) writes 'raw' text and the "
                                             "challenger 'lc_norm_tok' text"):
        gate.translate_with_version(store.client, NAME, "1", {"val": SOURCES}, None, None, max_len_b=12,
                                    batch_sentences=64, tracking_uri=store.uri, comparable_with="lc_norm_tok")


def test_a_version_registered_with_ctranslate2_decodes_with_its_export(store, tmp_path):
    files = gate.version_files(store.client, NAME, "4", tmp_path, store.uri)
    exported = files["MLmodel"].parent / "artifacts" / "ctranslate2"
    assert files["ctranslate2"] == exported and (exported / "model.bin").is_file()
    assert files["model"].name == "model.pt" and files["tokenizer"].name == "spm.model"   # beside it, as before
    assert mlmodel_settings(files["MLmodel"]) == WITH_CT2
    pins = (REPO / "requirements.txt").read_text().splitlines()
    assert next(line for line in pins if line.startswith("ctranslate2==")) in requirements(files)
    positions = load_model(store.model_file).config.max_positions
    expected = load_ct2_translator(store.ct2_model, store.tokenizer_file, WITH_CT2, positions).translate(SOURCES)
    model = mlflow.pyfunc.load_model(str(files["MLmodel"].parent))                     # the pyfunc model
    translator = model.unwrap_python_model().translator
    assert isinstance(translator, CT2Translator) and translator.decoding == WITH_CT2
    assert model.predict(pd.DataFrame({"text": SOURCES})) == expected
    assert model.predict(pd.DataFrame({"text": SOURCES}), params={"beam_size": 1}) == load_ct2_translator(
        store.ct2_model, store.tokenizer_file, WITH_CT2.replace(beam_size=1), positions).translate(SOURCES)
    got, used = gate.translate_with_version(store.client, NAME, "4", {"val": SOURCES}, None, None,   # the gate
                                            max_len_b=12, batch_sentences=64, tracking_uri=store.uri)
    assert got["val"] == expected and (used["engine"], used["compute_type"]) == ("ctranslate2", "int8")


def test_a_version_registered_before_the_engine_decodes_with_torch(store, tmp_path):
    old = DecodingConfig(beam_size=3, alpha=1.0, stopping="exact")
    for version in ("1", "3"):   # 1: engine torch, no export given; 3: neither the settings nor the engine
        files = gate.version_files(store.client, NAME, version, tmp_path / version, store.uri)
        assert "ctranslate2" not in files and not any("ctranslate2" in r for r in requirements(files))
    model = mlflow.pyfunc.load_model(str(files["MLmodel"].parent))
    assert isinstance(model.unwrap_python_model().translator, Translator)
    assert model.predict(pd.DataFrame({"text": SOURCES})) == load_translator(
        store.model_file, store.tokenizer_file, old, device="cpu").translate(SOURCES)


def test_a_version_is_logged_as_code_and_loads_without_unpickling(store, tmp_path, monkeypatch):
    files = gate.version_files(store.client, NAME, "1", tmp_path / "1", store.uri)
    folder = files["MLmodel"].parent
    pyfunc = mlflow.models.Model.load(str(files["MLmodel"])).flavors["python_function"]
    assert pyfunc["model_code_path"].endswith("mlflow_model_code.py") and "python_model" not in pyfunc
    assert (folder / "mlflow_model_code.py").is_file() and not list(folder.rglob("*.pkl"))
    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "false")   # what a later MLflow's default may be
    model = mlflow.pyfunc.load_model(str(folder))
    assert model.predict(pd.DataFrame({"text": SOURCES})) == load_translator(
        store.model_file, store.tokenizer_file, REGISTERED, device="cpu").translate(SOURCES)
    # Version 3 was logged as versions were before: a pickled TranslatorModel, which still loads where
    # MLflow allows unpickling (its default) and is refused, with MLflow's message, where it does not.
    old = gate.version_files(store.client, NAME, "3", tmp_path / "3", store.uri)["MLmodel"].parent
    assert (old / "python_model.pkl").is_file()
    with pytest.raises(mlflow.exceptions.MlflowException, match="Deserializing model using pickle is disallowed"):
        mlflow.pyfunc.load_model(str(old))
    monkeypatch.delenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION")
    assert isinstance(mlflow.pyfunc.load_model(str(old)).unwrap_python_model().translator, Translator)
