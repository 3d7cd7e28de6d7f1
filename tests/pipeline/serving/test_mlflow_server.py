"""pipeline/serving/mlflow_server.py and the pyfunc model behind it: ``python -m pipeline.serving.mlflow_server`` (what
``make serve-model`` runs) starts the real ``mlflow models serve`` on a free 127.0.0.1 port with
a tiny model trained here and registered in a temporary SQLite store; real HTTP requests get
translations, bad inputs a 400 with a message, and a bounded load test runs with zero errors."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from pipeline.config.decoding import DecodingConfig
from pipeline.pyfunc.log_version import log_translator
from pipeline.serving import mlflow_server
from pipeline.serving.mlflow_model import MAX_CHARS
from pipeline.serving.translator import Translator, load_translator
from pipeline.tracking.callback import MlflowCallback
from pipeline.tracking.runs import log_params
from pipeline.tracking.store import CHAMPION_ALIAS
from pipeline.tracking.tags import run_tags
from transformer.checkpoint import model_checkpoint, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import train_tokenizer
from transformer.training.token_store import encode_to_store
from transformer.training.trainer import TrainConfig, Trainer

from ..conftest import MIRROR, REPO

pytestmark = [pytest.mark.service, pytest.mark.training]

NAME = "serve-test"
SOURCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A little girl climbs into a playhouse."]
_spec = importlib.util.spec_from_file_location("serve_load", REPO / "bench" / "serve_load.py")
serve_load = sys.modules.setdefault("serve_load", importlib.util.module_from_spec(_spec))   # bench/ is no package
_spec.loader.exec_module(serve_load)


@dataclass
class Served:
    root: Path
    uri: str
    url: str
    client: MlflowClient
    run_id: str
    translator: Translator
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _train_and_register(root: Path, uri: str) -> tuple[str, Path, Path]:
    """A tiny model trained for 60 updates on 300 Multi30k pairs, tracked by the pipeline's
    MlflowCallback and registered (versions 1 and 2, the second with alpha 1.0) by the evaluate stage's
    ``log_translator``. Returns the run id, the checkpoint and the SentencePiece model."""
    raw = MIRROR / "data/task1/raw"
    en, de = _lines(raw / "train.en.gz", 300), _lines(raw / "train.de.gz", 300)
    tokenizer = train_tokenizer(en + de, root / "spm.model", 400)
    store = encode_to_store(tokenizer, en, de, root / "train")
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", tokenizer.vocab_size))
    params = {"model.preset": "tiny", "data.dataset": "multi30k", "data.max_words": 250, "data.valid_set": "val",
              "train.max_steps": 60, "train.precision": "fp32"}
    callback = MlflowCallback("serving-test", params, {"parameters": model.num_parameters(),
                                       "vocab_size": tokenizer.vocab_size, "train_pairs": len(store)},
                                       run_tags("multi30k", "en-de", "cpu"))
    Trainer(model, TrainConfig(max_steps=60, max_tokens=1024, warmup_steps=10, lr_scale=2.0, log_every=20,
                               checkpoint_every_steps=0, device="cpu"), store, callbacks=[callback]).train()
    save_checkpoint(root / "model.pt", model_checkpoint(model))
    client = MlflowClient(uri, uri)
    # The evaluate stage's params, as stage_run logs them into the training run.
    log_params(client, callback.run_id, {"evaluate.max_len_b": 12, "evaluate.precision": "fp32",
                                                  "evaluate.batch_sentences": 64})
    metrics = root / "scores.json"   # as the evaluate stage's reports/evaluate/scores.json
    metrics.write_text(json.dumps({"test": {"test_2016_flickr": {
                                       "bleu": 1.5, "chrf": 12.25, "sentences": 1000,
                                       "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
                                       "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6"}},
                                   "dev": {"val": {"bleu": 1.75, "chrf": 13.0}}}))
    versions = [log_translator(callback.run_id, root / "model.pt", root / "spm.model", NAME,
                               {"beam_size": 2, "alpha": alpha}, metrics_file=metrics,
                               corpus_stats_file=root / "missing-stats.json") for alpha in (0.6, 0.6, 1.0)]
    # The same bytes of the same run with the same settings are the same version: no identical second one.
    assert versions == ["1", "1", "2"], versions
    return callback.run_id, root / "model.pt", root / "spm.model"


def registered_in_temp_store(tmp_path_factory: pytest.TempPathFactory,
                             folder: str) -> tuple[Path, str, str, Path, Path]:
    """``_train_and_register`` in a new temporary SQLite store, version 1 made the champion (not the
    latest): (folder, store URI, run id, checkpoint, SentencePiece model)."""
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    root = tmp_path_factory.mktemp(folder)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(root)   # the experiment's default artifact folder (./mlruns) lands in the temp dir
        torch.set_num_threads(1)   # a tiny model: more threads only wait on each other (measured 10x slower)
        try:
            run_id, model_file, tokenizer_file = _train_and_register(root, uri)
        finally:
            torch.set_num_threads(threads)
    MlflowClient(uri, uri).set_registered_model_alias(NAME, CHAMPION_ALIAS, "1")
    return root, uri, run_id, model_file, tokenizer_file


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The server, started once for the module (a start costs ~10 s), and what it serves."""
    root, uri, run_id, model_file, tokenizer_file = registered_in_temp_store(tmp_path_factory, "serving")
    client = MlflowClient(uri, uri)
    port = _free_port()
    log = root / "server.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "pipeline.serving.mlflow_server", "--name", NAME,
                                   "--port", str(port)], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"the server exited ({server.returncode}): {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the server did not answer /ping in 120 s: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        translator = load_translator(model_file, tokenizer_file, DecodingConfig(beam_size=2, alpha=0.6, max_len_b=12),
                                     device="cpu")
        yield Served(root, uri, f"http://127.0.0.1:{port}/invocations", client, run_id, translator, log)
    finally:   # uvicorn's workers are children of the server: end the whole group
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def post(served: Served, payload) -> tuple[int, dict]:
    return serve_load.post(served.url, payload, timeout=60)


def test_serves_the_champion_not_the_latest_version(served):
    head = served.log.read_text().splitlines()[0]
    assert head.startswith(f"serving {NAME} version 1 (alias champion; run {served.run_id})"), head
    version, why = mlflow_server.served_version(served.client, NAME)
    assert (str(version.version), why) == ("1", "alias champion")
    served.client.delete_registered_model_alias(NAME, CHAMPION_ALIAS)
    try:
        version, why = mlflow_server.served_version(served.client, NAME)
        assert str(version.version) == "2" and why.startswith("latest version")
    finally:
        served.client.set_registered_model_alias(NAME, CHAMPION_ALIAS, "1")
    assert "--env-manager local" in " ".join(mlflow_server.serve_command("models:/x/1"))


def test_records_and_inputs_forms_translate_like_the_translator(served):
    expected = served.translator.translate(SOURCES)
    status, body = post(served, {"dataframe_records": [{"text": s} for s in SOURCES]})
    assert status == 200, body
    assert body["predictions"] == expected
    status, body = post(served, {"inputs": {"text": SOURCES}})
    assert (status, body.get("predictions")) == (200, expected), body
    status, body = post(served, {"dataframe_split": {"columns": ["text"], "data": [[s] for s in SOURCES]}})
    assert (status, body.get("predictions")) == (200, expected), body
    # A request's params change the decoding for that request only.
    status, body = post(served, {"dataframe_records": [{"text": s} for s in SOURCES], "params": {"beam_size": 1}})
    assert (status, body.get("predictions")) == (200, served.translator.translate(SOURCES, beam_size=1)), body
    status, body = post(served, {"dataframe_records": [{"text": SOURCES[0]}]})
    assert body["predictions"] == expected[:1]


@pytest.mark.parametrize("payload, message", [
    ({"dataframe_records": [{"text": "A dog."}, {"text": ""}]}, "text[1] is empty"),
    ({"dataframe_records": [{"text": "   "}]}, "text[0] is empty"),
    ({"dataframe_records": [{"text": 42}]}, "42"),
    ({"dataframe_records": [{"text": "word " * 300}]}, f"has 1500 characters; at most {MAX_CHARS}"),
    ({"dataframe_records": [{"text": "Zq" * 400}]}, "pieces long; the model reads at most 255"),
    ({"dataframe_records": [{"text": "A dog."}], "params": {"beam_size": 99}}, "beam_size must be between 1 and 16"),
    ({"inputs": ["A dog."], "params": {"stopping": "soon"}}, "stopping must be one of exact, fairseq"),
    ({"dataframe_records": [{"text": "A dog."}] * 300}, "300 sentences in one request; at most 256"),
    ({"dataframe_records": [{"other": "A dog."}]}, "text"),
    # JSON's lone-surrogate escape is no text: MLflow's schema enforcement refuses it before the model's
    # own check does (test_mlflow_model).
    ({"inputs": ["A \ud800 dog."]}, "surrogates not allowed"),
    ({"dataframe_records": "abc"}, "must be a list of records"),   # MLflow's own check of the form
])
def test_bad_inputs_get_a_400_with_the_reason(served, payload, message):
    status, body = post(served, payload)
    assert status == 400, body
    assert body.get("error_code") in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST"), body
    assert message in body.get("message", ""), body["message"][:500]


def test_malformed_json_gets_the_servers_400_and_the_server_keeps_serving(served):
    request = urllib.request.Request(served.url, b'{"dataframe_records": [{"text": "A dog.',
                                     {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 400
    status, body = post(served, {"dataframe_records": [{"text": SOURCES[1]}]})
    assert (status, body["predictions"]) == (200, served.translator.translate(SOURCES[1:2]))


def test_bounded_load_has_no_errors(served):
    """300 one-sentence requests from 4 threads within 90 s: every answer a 200 with a translation."""
    result = serve_load.run_load(served.url, SOURCES * 10, requests=300, concurrency=4, time_limit_s=90)
    print(f"\nserving load (tiny model, beam 2, max_len_b 12, 1 worker, 4 concurrent): {result.summary()}")
    assert result.errors == [] and result.unsent == 0
    assert len(result.latencies_s) == 300 and result.sentences == 300
    assert 0 < serve_load.statistics.median(result.latencies_s) <= result.percentile(95) < 30
    assert result.sentences_per_s > 1


def test_registered_version_has_a_model_card(served):
    version = served.client.get_model_version(NAME, "1")
    card, tags = version.description, version.tags
    run = served.client.get_run(served.run_id)
    parameters = int(run.data.params["derived.parameters"])
    assert run.info.run_name.startswith("tiny-multi30k-en-de-") and "@" in run.info.run_name
    for fact in (f"# {NAME} version 1", "translates en to de", "preset `tiny`", f"{parameters:,} parameters",
                 "vocabulary of 400 pieces", "| test_2016_flickr | 1.50 | 12.25 | 1000 |",
                 "sacreBLEU `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`",
                 "validation (val", "BLEU 1.75", "Beam size 2", "alpha 0.6", "source length + 12", "fp32",
                 "Data set `multi30k`, en-de: 300 training pairs after cleaning", "60 updates",
                 "complete epochs", "wall time on cpu (", "torch " + torch.__version__,
                 "image captions", "Casing: trained on cased", "at most 250 words", "255 source positions",
                 served.run_id):
        assert fact in card, (fact, card)
    assert tags["preset"] == "tiny" and tags["dataset"] == "multi30k" and tags["language_pair"] == "en-de"
    assert tags["params"] == str(parameters) and tags["vocab_size"] == "400" and tags["train_pairs"] == "300"
    assert tags["bleu.test_2016_flickr"] == "1.50" and tags["chrf.test_2016_flickr"] == "12.25"
    assert tags["bleu.dev.val"] == "1.75" and tags["sacrebleu.test_2016_flickr"].startswith("nrefs:1|")
    assert tags["decoding.beam_size"] == "2" and tags["decoding.max_len_b"] == "12" and tags["train.updates"] == "60"
    assert tags["device"] == "cpu" and tags["device.name"] and tags["run_name"] == run.info.run_name
    found = served.client.search_model_versions(f"name = '{NAME}' and tags.preset = 'tiny'")
    assert {str(v.version) for v in found} == {"1", "2"}
