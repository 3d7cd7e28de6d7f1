"""pipeline/tracking/ against a real MLflow store: the pipeline's run, its params, metric
histories, attention artifacts, the registered pyfunc model; and a server that goes away."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import matplotlib.image as mpimg
import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.serving.translator import Translator
from pipeline.tracking import callback
from pipeline.tracking.unsent import buffer
from transformer.checkpoint import load_model
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer
from transformer.training.token_store import write_token_store
from transformer.training.trainer import TrainConfig, Trainer, TrainerCallback

from .conftest import BIN

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def run(workspace):
    client = MlflowClient(workspace.tracking_uri, workspace.tracking_uri)
    experiment = client.get_experiment_by_name("test-experiment")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.dataset = 'multi30k'",
                              order_by=["attributes.start_time ASC"])
    return client, runs[0]


def test_params_are_the_flattened_params_yaml_plus_derived_facts(run):
    _, r = run
    p = r.data.params
    assert p["train.max_steps"] == "40" and p["model.preset"] == "tiny" and p["tokenizer.vocab_size"] == "400"
    assert p["data.test_sets"] == '["test_2016_flickr"]' and p["evaluate.beam_size"] == "2"
    assert p["average.last_n"] == "3"
    assert p["derived.vocab_size"] == "400" and p["derived.train_pairs"] == "300"
    assert int(p["derived.parameters"]) > 10_000


def test_tags(run):
    tags = run[1].data.tags
    assert tags["dataset"] == "multi30k" and tags["language_pair"] == "en-de" and tags["device"] == "cpu"
    # The workspace was committed before `dvc repro`; what the pipeline itself rewrites (dvc.lock,
    # reports/) is not a local change of the code the run was made from.
    assert len(tags["git.commit"]) == 40 and tags["git.dirty"] == "false"
    assert tags["train.precision_used"] == "fp32"
    assert tags["torch.version"].startswith("2.")
    assert any(k.startswith("data.md5.data/corpus") for k in tags)


def test_metric_histories(run):
    client, r = run
    steps = lambda key: [m.step for m in sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)]
    for key in ("train/loss", "train/ppl", "train/lr", "train/grad_norm", "train/target_tokens_per_s"):
        assert steps(key) == [10, 20, 30, 40], key
    assert steps("valid/ppl") == [20, 40]
    m = r.data.metrics
    assert 0.0 <= m["test/test_2016_flickr/bleu"] <= 100.0 and "test/test_2016_flickr/chrf" in m
    for stage in ("train", "average", "evaluate"):
        assert m[f"time/{stage}_seconds"] > 0.0


def test_attention_artifacts_decode_as_images(run, tmp_path):
    client, r = run
    names = [a.path for a in client.list_artifacts(r.info.run_id, "attention")]
    assert len(names) == 6 and all(n.endswith(".png") for n in names)
    local = client.download_artifacts(r.info.run_id, names[0], str(tmp_path))
    assert mpimg.imread(local).ndim == 3
    run_files = {Path(a.path).name for a in client.list_artifacts(r.info.run_id, "run")}
    assert {"params.yaml", "dvc.lock", "metrics.json", "scores.json"} <= run_files


def test_registered_model_translates_through_pyfunc(run, workspace):
    client, r = run
    versions = client.search_model_versions("name = 'test-translator'")
    assert any(v.run_id == r.info.run_id for v in versions)
    version = min(int(v.version) for v in versions if v.run_id == r.info.run_id)
    mlflow.set_tracking_uri(workspace.tracking_uri)
    mlflow.set_registry_uri(workspace.tracking_uri)
    model = mlflow.pyfunc.load_model(f"models:/test-translator/{version}")
    sentences = ["A man is riding a bike.", "Two dogs play."]
    out = model.predict(pd.DataFrame({"text": sentences}))
    assert isinstance(out, list) and len(out) == 2 and all(isinstance(s, str) for s in out)
    # The same translations as the pipeline's own translator on the averaged model (beam 4).
    translator = Translator(load_model(workspace.path / "models/model.pt"),
                            Tokenizer(workspace.path / "data/tokenizer/spm.model"))
    assert out == translator.translate(sentences)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(tmp_path: Path, port: int, db: Path) -> subprocess.Popen:
    server = subprocess.Popen(
        [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{db}", "--default-artifact-root", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.5)
    return server


def _kill_server(server: subprocess.Popen) -> None:
    """The server's workers are its children: end the whole group."""
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait()


@pytest.mark.service
@pytest.mark.pipeline
def test_training_survives_a_tracking_server_that_goes_away_and_replays_into_the_same_run(tmp_path, monkeypatch):
    """A real MLflow server on 127.0.0.1 is killed at update 30 of 60: training finishes, the metrics
    sent before are in the store, the rest (and the run's end) are kept in reports/mlflow_unsent.json;
    once the server is back, the replay sends them into the same run and empties the file."""
    port = _free_port()
    db = tmp_path / "server.db"
    server = _start_server(tmp_path, port, db)
    try:
        uri = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(tmp_path)
        store = write_token_store(tmp_path / "train", [([4 + i % 20, 5, 6], [7, 8 + i % 10]) for i in range(64)], 32)
        cb = callback.MlflowCallback("server-test", {"train.max_steps": 60}, {}, {"dataset": "toy"})

        class KillServer(TrainerCallback):
            def on_log(self, step, metrics):
                if step == 30:
                    cb.logger.close()  # flush what came so far, then pull the server away
                    cb.logger = buffer.BackgroundLogger(cb.client, cb.run_id, flush_seconds=0.2)
                    _kill_server(server)

        trainer = Trainer(Transformer(build_config("tiny", 32)),
                          TrainConfig(max_steps=60, max_tokens=64, warmup_steps=5, log_every=10,
                                      checkpoint_every_steps=0, device="cpu"),
                          store, callbacks=[cb, KillServer()])
        trainer.train()
        assert trainer.step == 60
        unsent = buffer.UNSENT_FILE
        assert unsent.is_file()
        kept = json.loads(unsent.read_text())["runs"][cb.run_id]
        assert {m["step"] for m in kept["metrics"] if m["key"] == "train/loss"} == {40, 50, 60}
        assert kept["status"] == "FINISHED"
    finally:
        _kill_server(server)
    # The metrics sent before the server went away are in its store.
    client = MlflowClient(f"sqlite:///{db}")
    history = client.get_metric_history(cb.run_id, "train/loss")
    assert sorted(m.step for m in history) == [10, 20, 30]
    assert client.get_run(cb.run_id).info.status == "RUNNING"
    # Server away: the replay keeps everything for the next try.
    assert buffer.replay_unsent() == 1 and unsent.is_file()
    server = _start_server(tmp_path, port, db)
    try:
        assert buffer.replay_unsent() == 0
        assert not unsent.is_file()
    finally:
        _kill_server(server)
    history = client.get_metric_history(cb.run_id, "train/loss")
    assert sorted(m.step for m in history) == [10, 20, 30, 40, 50, 60]
    assert client.get_run(cb.run_id).info.status == "FINISHED"
