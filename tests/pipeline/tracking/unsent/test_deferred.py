"""pipeline/tracking/unsent/deferred.py and buffer.py's replay: what waits for the tracking server, said in
one line per stage while the server is away (the replay's own failure is silent there, said by the
command that replays by hand), and no lock taken, nor its file made, when nothing waits."""

from __future__ import annotations

import pytest
from mlflow.entities import Metric

from pipeline.tracking.unsent import buffer, deferred, on_disk
from pipeline.tracking.unsent.records import average as average_record

from ..test_offline_training import nowhere

pytestmark = pytest.mark.fast


def test_nothing_waiting_takes_no_lock_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere())   # never asked: nothing to send
    assert deferred.replay() == 0 and deferred.replay(quiet=True) == 0 and buffer.replay_unsent() == 0
    assert list(tmp_path.iterdir()) == []


def test_a_stage_says_what_waits_in_one_line_while_the_server_is_away(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere())
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    buffer.save_unsent("a" * 32, [Metric("train/loss", 2.5, 0, 10)], status="FINISHED")   # a training's leftovers
    capsys.readouterr()

    deferred.submit(average_record, {"checkpoints_used": 3})   # what a stage does at its end
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("warning: MLflow: waiting in reports/mlflow_unsent.json for http://127.0.0.1:")
    assert "metrics/tags of run(s) aaaaaaaa; the average record(s); sent by the next stage" in line
    doc = on_disk.load()
    assert list(doc["runs"]) == ["a" * 32] and [r["stage"] for r in doc["records"]] == ["average"]

    # By hand (python -m pipeline.tracking.replay, make push): the replay says why it failed.
    assert deferred.replay() == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: MLflow replay of reports/mlflow_unsent.json failed (MlflowException: ")
    assert line.endswith("kept for the next try")


def test_a_replay_finds_every_stages_sender_by_the_stage_its_record_names():
    import importlib
    import types

    for stage, name in deferred.SENDERS.items():   # the evaluate stage's among them, in pipeline/pyfunc/
        sender = importlib.import_module(name)
        assert sender.STAGE == stage and callable(sender.send) and callable(sender.links)
    assert set(deferred.SENDERS) == {"train", "average", "tune", "evaluate"}
    stray = types.ModuleType("pipeline.tracking.unsent.records.stray")
    stray.STAGE = "average"
    with pytest.raises(ValueError, match="is not the sender of stage 'average' in SENDERS"):
        deferred.submit(stray, {})   # a replay would import another module for it: refused before queueing
