"""A training that starts while the tracking server does not answer: no run to log into, so the
callback keeps the run (params, tags, every metric value, the checkpoint link, its end) and queues
it at the end as the training's record; the replay, against a store that answers, makes the run as
the live callback would have, and a record sent half-way never makes a second run."""

from __future__ import annotations

import json
import socket

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking import callback
from pipeline.tracking.links import LINK_CHECKPOINT
from pipeline.tracking.unsent import deferred, on_disk
from pipeline.tracking.unsent.records import train as train_record
from transformer.atomic import file_sha256
from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.checkpoint_files import list_checkpoints
from transformer.training.token_store import write_token_store
from transformer.training.trainer import TrainConfig, Trainer

pytestmark = pytest.mark.slow   # a training and three SQLite stores made from scratch: ~20 s on 2 cores


def nowhere() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"   # closed again: nothing answers there


def test_a_training_without_a_server_queues_its_run_and_the_replay_makes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere())
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    store = write_token_store(tmp_path / "train", [([4 + i % 20, 5, 6], [7, 8 + i % 10]) for i in range(64)], 32)
    cb = callback.MlflowCallback("offline-test", {"train.max_steps": 30}, {"parameters": 1}, {"dataset": "toy"})
    trainer = Trainer(Transformer(build_config("tiny", 32)),
                      TrainConfig(max_steps=30, max_tokens=64, warmup_steps=5, log_every=10, checkpoint_every_steps=15,
                                  device="cpu"), store, checkpoint_dir=tmp_path / "checkpoints", callbacks=[cb])
    trainer.train()
    err = capsys.readouterr().err
    assert "warning: MLflow: no run at http://127.0.0.1:" in err
    assert "waiting in reports/mlflow_unsent.json" in err and "the train record(s)" in err
    (record,) = json.loads(on_disk.UNSENT_FILE.read_text())["records"]
    assert record["stage"] == "train" and record["data"]["status"] == "FINISHED"
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    assert record["data"]["link_tags"] == {LINK_CHECKPOINT: file_sha256(newest)}
    assert {step for key, _, step, _ in record["data"]["metrics"] if key == "train/loss"} == {10, 20, 30}

    # Still away: the replay keeps it. A store that answers (the embedded one): the run is made once,
    # even when the first try stopped half-way (its run kept in ``progress``).
    assert deferred.replay(quiet=True) == 1
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    real_log_params = train_record.log_params

    def fails_after_the_run_is_made(*args):
        raise ConnectionError("the server went away again")

    monkeypatch.setattr(train_record, "log_params", fails_after_the_run_is_made)
    assert deferred.replay(quiet=True) == 1
    half = json.loads(on_disk.UNSENT_FILE.read_text())["records"][0]["progress"]
    assert half["created"] and half["run_id"]
    monkeypatch.setattr(train_record, "log_params", real_log_params)
    assert deferred.replay(quiet=True) == 0 and not on_disk.UNSENT_FILE.exists()
    assert f"MLflow: made run {half['run_id']} from the training's record" in capsys.readouterr().out

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("offline-test").experiment_id])
    assert run.info.run_id == half["run_id"] and run.info.status == "FINISHED"
    assert run.data.params["train.max_steps"] == "30" and run.data.params["derived.parameters"] == "1"
    assert run.data.tags["dataset"] == "toy" and run.data.tags[LINK_CHECKPOINT] == file_sha256(newest)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == [10, 20, 30]
    assert client.get_metric_history(run.info.run_id, "train/updates")[0].value == 30


@pytest.mark.parametrize("finished", [True, False], ids=["finished-run", "unfinished-run"])
def test_a_resumed_training_continues_an_unfinished_run_and_links_to_a_finished_one(tmp_path, monkeypatch,
                                                                                  finished):
    """The record's choice at send time, as the live callback's at the start: a run still
    unfinished that wrote the checkpoint resumed from is continued (only the steps it lacks are
    sent); a finished one is left as it is, the new run tagged with it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")   # MLflow sets it globally
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("resume-test")
    earlier = client.create_run(experiment, tags={LINK_CHECKPOINT: "a" * 64}).info.run_id
    client.log_metric(earlier, "train/loss", 2.0, step=10)
    if finished:
        client.set_terminated(earlier, "FINISHED")
    data = {"experiment": "resume-test", "run_name": "resumed", "start_time": 1, "end_time": 2,
            "params": {"train.max_steps": 20}, "tags": {"dataset": "toy"}, "resumed_from": ["a" * 64],
            "init_sha256": None, "metrics": [["train/loss", 2.0, 10, 5], ["train/loss", 1.0, 20, 6]],
            "link_tags": {LINK_CHECKPOINT: "b" * 64}, "status": "FINISHED"}
    progress: dict = {}
    train_record.send(data, {}, progress)
    assert progress["created"] is finished and (progress["run_id"] == earlier) is not finished
    run = client.get_run(progress["run_id"])
    assert sorted(m.step for m in client.get_metric_history(progress["run_id"], "train/loss")) == [10, 20]
    assert run.data.tags[LINK_CHECKPOINT] == "b" * 64 and run.info.status == "FINISHED"
    assert run.data.tags.get(train_record.LINEAGE) == (earlier if finished else None)
    if finished:   # the finished run is as it was
        assert client.get_run(earlier).data.tags[LINK_CHECKPOINT] == "a" * 64
