"""The unsent queue against the stack's real MLflow server, without a training: a refusal is never
queued; a record the server will not take for another reason is set aside with the records that
need it, the others go on, and ``python -m pipeline.tracking.replay --list / --retry / --drop``
handle it. The records are the stages' own (``pipeline.tracking.unsent.records``), sent by the queue's
own code; "away" is a port where nothing listens, as a client sees a server that is down."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid

import pytest
import yaml
from mlflow.entities import Metric

from pipeline.pyfunc import evaluate_record
from pipeline.tracking.links import LINK_CHECKPOINT, LINK_MODEL
from pipeline.tracking.preflight import CredentialsRefused
from pipeline.tracking.unsent import buffer, deferred, on_disk
from pipeline.tracking.unsent.records import average as average_record

from ..pipeline.conftest import BIN
from ..pipeline.tracking.test_offline_training import nowhere
from .conftest import PYTHON, REPO, Stack, server_client

pytestmark = pytest.mark.service

QUEUE = "reports/mlflow_unsent.json"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture()
def repository(stack: Stack, tmp_path, monkeypatch):
    """A repository folder (``.dvc``) as the working folder, the stack's server and credentials in
    the environment (as ``source .stack/env`` sets them); a request that gets no answer fails at once."""
    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    monkeypatch.chdir(repo)
    env = stack.client_env
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    return repo


def replay_cli(repo, *args: str, **changed: str) -> subprocess.CompletedProcess:
    """``python -m pipeline.tracking.replay ARGS`` in ``repo``, with this process's environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **changed}
    return subprocess.run([PYTHON, "-m", "pipeline.tracking.replay", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)


def averaged(experiment: str, checkpoint: str, model: str) -> dict:
    """The average stage's record data for the newest averaged checkpoint ``checkpoint``."""
    return {"experiment": experiment, "section": {"average.last_n": 5}, "checkpoint_sha256": checkpoint,
            "model_sha256": model, "timestamp": 1_700_000_000_000,
            "metrics": {"time/average_seconds": 0.5, "average/checkpoints_used": 5}}


def ours(stderr: str) -> list[str]:
    """Our lines on stderr (Python's warnings printed while MLflow imports aside)."""
    return [line for line in stderr.splitlines() if "Warning" not in line and "color_warning(" not in line
            and not line.startswith("  ")]


def test_a_record_the_server_will_not_take_is_set_aside_with_what_needs_it(repository, monkeypatch, capsys):
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = server_client(uri)
    experiment = f"queue-{uuid.uuid4().hex[:8]}"
    experiment_id = client.create_experiment(experiment)
    c1, c2, m1, m2 = sha("checkpoint 1"), sha("checkpoint 2"), sha("model 1"), sha("model 2")
    killed = client.create_run(experiment_id, run_name="server-killed-during-training").info.run_id
    other = client.create_run(experiment_id, tags={LINK_CHECKPOINT: c2}).info.run_id
    model = repository / "model.pt"
    model.write_bytes(b"the averaged weights")

    # The server away: a training's leftovers (its last losses, its checkpoint link, its end) and
    # three later records wait, in order; the evaluate record's model is kept by its sha256.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere())
    buffer.save_unsent(killed, [Metric("train/loss", 2.5, 0, 40)], {LINK_CHECKPOINT: c1}, status="FINISHED")
    deferred.submit(average_record, averaged(experiment, c1, m1))
    deferred.submit(average_record, averaged(experiment, c2, m2))
    deferred.submit(evaluate_record, {"experiment": experiment, "section": {}, "model_sha256": sha("model 3"),
                                      "tuned": False, "decoding": {"beam_size": 4}, "values": {"bleu": 1.0},
                                      "registered_model": "queue-model", "timestamp": 1_700_000_000_000},
                    files={"model.pt": model}, pinned={"model.pt": hashlib.sha256(model.read_bytes()).hexdigest()},
                    registers="queue-model")
    doc = on_disk.load()
    assert [r["stage"] for r in doc["records"]] == ["average", "average", "evaluate"] and killed in doc["runs"]
    evaluate_id = doc["records"][2]["id"]
    # Meanwhile the training's run was deleted on the server, and the kept model edited by hand.
    client.delete_run(killed)
    (repository / "reports/mlflow_unsent" / evaluate_id / "model.pt").write_bytes(b"other weights")
    capsys.readouterr()

    # Back: the leftovers (400: the run is deleted) are set aside with the average record that needs
    # their checkpoint link; the evaluate record (its file edited) too; the other training's goes on.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert deferred.replay() == 0
    err = capsys.readouterr().err
    doc = on_disk.load()
    run_entry, held, edited = doc["set_aside"]
    assert (run_entry["stage"], run_entry["run_id"], held["stage"], edited["id"]) == ("run", killed, "average",
                                                                                      evaluate_id)
    assert "INVALID_PARAMETER_VALUE" in run_entry["reason"] and "must be in the 'active' state" in run_entry["reason"]
    assert held["held_by"] == run_entry["id"] and held["reason"] == f"needs the set-aside leftovers of run {killed}"
    assert "is not the file kept" in edited["reason"] and "edited or removed by hand?" in edited["reason"]
    assert doc["records"] == [] and doc["runs"] == {}
    assert err.count("warning: MLflow: set aside the ") == 3 and "--retry ID or --drop ID" in err, err
    sent = client.get_run(other)   # the other training's record went on
    assert sent.data.tags[LINK_MODEL] == m2 and sent.data.metrics["average/checkpoints_used"] == 5

    # A stage's record after that is sent, and its one line says what is set aside.
    deferred.submit(average_record, averaged(experiment, c2, m2))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: MLflow: in {QUEUE}, set aside, not sent until handled: leftovers of run "
                           f"{killed}, average record {held['id']}, evaluate record {evaluate_id} ("), line

    listed = replay_cli(repository, "--list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [x.split()[0] for x in lines] == [run_entry["id"], held["id"], evaluate_id], listed.stdout
    assert "(registers 'queue-model' for the model of sha256 " in lines[2] and "edited or removed" in lines[2]

    # The run restored on the server: --retry sends its leftovers and the record that needed them.
    client.restore_run(killed)
    retried = replay_cli(repository, "--retry", run_entry["id"])
    assert retried.returncode == 1, retried.stdout + retried.stderr   # the evaluate record is still set aside
    assert f"MLflow: replayed into run {killed} what it could not send before: 1 metric values" in retried.stdout
    assert "MLflow: sent the average record that waited in reports/mlflow_unsent.json" in retried.stdout
    run = client.get_run(killed)
    assert run.info.status == "FINISHED" and run.data.tags[LINK_CHECKPOINT] == c1 and run.data.tags[LINK_MODEL] == m1
    assert [m.step for m in client.get_metric_history(killed, "train/loss")] == [40]
    assert [e["id"] for e in on_disk.load()["set_aside"]] == [evaluate_id]

    # --drop: the edited record and its registration go for good, with their kept files.
    dropped = replay_cli(repository, "--drop", evaluate_id)
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.strip() == (f"MLflow: dropped the set-aside evaluate record {evaluate_id} (and with it the "
                                      "registration of 'queue-model'); it will never be sent")
    assert not (repository / QUEUE).exists() and not (repository / "reports/mlflow_unsent" / evaluate_id).exists()
    unknown = replay_cli(repository, "--drop", evaluate_id)
    assert unknown.returncode == 2 and ours(unknown.stderr) == [
        f"error: nothing set aside has the ID '{evaluate_id}' (python -m pipeline.tracking.replay --list)"]


def test_refused_credentials_are_never_queued_and_push_says_so_in_one_line(repository, monkeypatch):
    uri = os.environ["MLFLOW_TRACKING_URI"]
    experiment = f"queue-{uuid.uuid4().hex[:8]}"
    password = os.environ["MLFLOW_TRACKING_PASSWORD"]
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(CredentialsRefused) as refused:
        deferred.submit(average_record, averaged(experiment, sha("c"), sha("m")))
    assert str(refused.value).startswith(f"the MLflow server at {uri} answered 401: its credentials were refused")
    assert not (repository / QUEUE).exists()   # nothing kept: no retry would send it

    # Something waits (queued while the server was away); the push's replay with a wrong password:
    # one line naming the credentials, exit 2, everything still waiting.
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nowhere())
    deferred.submit(average_record, averaged(experiment, sha("c"), sha("m")))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    makefile = (REPO / "Makefile").read_text()
    push_replay = "python -m pipeline.tracking.replay --keep-going --quiet"
    assert push_replay in makefile.split("\npush:")[1].split("\n\n")[0]   # what make push runs first
    wrong = replay_cli(repository, "--keep-going", "--quiet", MLFLOW_TRACKING_PASSWORD="wrong")
    assert wrong.returncode == 2 and wrong.stdout == "", wrong.stdout + wrong.stderr
    assert ours(wrong.stderr) == [f"error: the MLflow server at {uri} answered 401: its credentials were refused "
                                  "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD; with the team's stack, "
                                  "`source .stack/env`)"], wrong.stderr
    assert "wrong" not in wrong.stderr and password not in wrong.stderr
    assert [r["stage"] for r in json.loads((repository / QUEUE).read_text())["records"]] == ["average"]
    right = replay_cli(repository, "--keep-going", "--quiet")
    assert right.returncode == 0 and right.stderr.count("warning: MLflow:") == 0, right.stdout + right.stderr
    assert not (repository / QUEUE).exists()


STAGE = """stages:
  point:
    cmd: python -m tests.team.record_stage
    params:
      - point
    outs:
      - out.txt
"""


def test_a_record_queued_in_a_temporary_workspace_outlives_it(repository, monkeypatch):
    """A sweep's points run in DVC's temporary workspaces (``<repo>/.dvc/tmp/exps/...``, deleted after
    each run: ``make sweep``'s queue, ``dvc exp run --temp``). One point's stage, with the server
    away, queues its record (``tests/team/record_stage.py``: an average record, through the queue's
    own code): it waits in the repository's queue, not the workspace's, and the replay sends it."""
    uri = os.environ["MLFLOW_TRACKING_URI"]
    client = server_client(uri)
    experiment = f"queue-{uuid.uuid4().hex[:8]}"
    checkpoint, model = sha("swept checkpoint"), sha("swept model")
    run_id = client.create_run(client.create_experiment(experiment), tags={LINK_CHECKPOINT: checkpoint}).info.run_id
    (repository / ".dvc").rmdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    (repository / "dvc.yaml").write_text(STAGE)
    (repository / "params.yaml").write_text(yaml.safe_dump(
        {"point": {"experiment": experiment, "checkpoint": checkpoint, "model": model, "value": 1}}))
    for command in (["git", "init", "-q", "-b", "main"], [str(BIN / "dvc"), "init", "-q"],
                    ["git", "add", "-A"], ["git", "commit", "-qm", "sweep"]):
        subprocess.run(command, cwd=repository, env=env, check=True, capture_output=True)
    away = {**env, "MLFLOW_TRACKING_URI": nowhere()}
    for command in (["exp", "run", "--queue", "-S", "point.value=2"], ["exp", "run", "--run-all", "-j", "1"]):
        done = subprocess.run([str(BIN / "dvc"), *command], cwd=repository, env=away, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    queue = json.loads((repository / QUEUE).read_text())
    assert [(r["stage"], r["data"]["model_sha256"]) for r in queue["records"]] == [("average", model)]
    assert not [p for p in (repository / ".dvc/tmp/exps").rglob("out.txt")]   # the point's workspace is gone
    sent = replay_cli(repository)
    assert sent.returncode == 0 and "MLflow: sent the average record" in sent.stdout, sent.stdout + sent.stderr
    assert client.get_run(run_id).data.tags[LINK_MODEL] == model and not (repository / QUEUE).exists()
