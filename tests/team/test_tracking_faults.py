"""Tracking under faults, with the real MLflow server of the stack: a server killed during training
loses no registration (back before the pipeline's end, or only after it: the version exists once the
queue is sent), a finished run is never resumed into, and a refused or silent server is one line and
exit 2 for the commands that need it (serve-model, compare).

One workspace (the tiny model on 300 Multi30k pairs) serves the first two: its first pipeline has
the server killed during training and back before evaluate; its second raises ``train.max_steps``
(a finished run's model trained further), has the server killed again and back only after the
pipeline, when ``python -m pipeline.tracking.replay`` registers the version; its third raises it
again with the server away before the training starts (no run to log into: the training's whole
run waits in the queue) and back before tune, whose replay makes the run and registers the version;
its fourth (a wrong password, a forced re-evaluation): ``refused_and_repeated``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from pipeline.config import paths
from pipeline.flows.gate import pending_challenger
from pipeline.stack.groups import read_record
from pipeline.stack.processes import stop_pid
from transformer.atomic import file_sha256

from ..pipeline.conftest import BIN, orchestration_params
from .conftest import PYTHON, REPO, Stack
from .test_faults import client_for, machine, needs_mirror, restart  # noqa: F401 (a fixture)
from .test_two_machines import Machine

pytestmark = pytest.mark.service

MODEL = "faults-model"
WAITING = "waiting in reports/mlflow_unsent.json"


def kill_mlflow(stack: Stack) -> None:
    """SIGKILL to the MLflow server's process group (its workers too): a crash, not a shutdown."""
    record = read_record(stack.directory / "run" / "mlflow.pid")
    assert record is not None
    stop_pid(record.pid, signal.SIGKILL)


def train_killing_the_server(stack: Stack, m: Machine, at_update: int) -> str:
    """``dvc repro train`` with the MLflow server SIGKILLed when the training logs ``at_update``
    (the training held still meanwhile); returns its output. The server stays down."""
    train = subprocess.Popen([str(BIN / "dvc"), "repro", "train"], cwd=m.path, env=m.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output, killed = [], False
    try:
        for line in train.stdout:
            output.append(line)
            if line.startswith(f"step {at_update:>6}  epoch"):
                os.killpg(train.pid, signal.SIGSTOP)
                kill_mlflow(stack)
                killed = True
                os.killpg(train.pid, signal.SIGCONT)
        assert train.wait(timeout=300) == 0, "".join(output)
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)
        if not killed:
            restart(stack)
    assert killed, "".join(output)
    return "".join(output)


def repro(m: Machine, *stages: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = m.dvc("repro", *stages)
    print(f"dvc repro {' '.join(stages)}: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def versions_of(client, run_ids: set[str]) -> list:
    return [v for v in client.search_model_versions(f"name = '{MODEL}'") if v.run_id in run_ids]


def family(client, run_id: str) -> set[str]:
    """The run and its child runs (a stage logs into a child when its params differ)."""
    experiment = client.get_run(run_id).info.experiment_id
    children = client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{run_id}'")
    return {run_id, *(c.info.run_id for c in children)}


@pytest.mark.usefixtures("needs_mirror")
def test_server_killed_during_training_loses_no_registration(stack, tmp_path, monkeypatch):
    params = orchestration_params({"tracking": {"experiment": "faults-tracking", "registered_model": MODEL}})
    m = machine(stack, tmp_path / "repo", params)
    m.env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"   # a server away fails each request at once
    repro(m, "tokenizer")

    # 1. Killed at update 20 of 40, back before the end: average and tune wait, evaluate sends all.
    text = train_killing_the_server(stack, m, 20)
    assert "could not be sent; kept in reports/mlflow_unsent.json" in text, text
    first_run = next(line.split()[2] for line in text.splitlines() if line.startswith("MLflow: run "))
    while_away = repro(m, "average", "tune")
    assert while_away.stderr.count(WAITING) == 2, while_away.stderr   # one line per stage
    assert "MLflow replay of" not in while_away.stderr, while_away.stderr   # and no other about it
    queue = json.loads((m.path / "reports/mlflow_unsent.json").read_text())
    assert [r["stage"] for r in queue["records"]] == ["average", "tune"] and first_run in queue["runs"]
    kept = queue["runs"][first_run]   # the training's end, and the losses logged after the kill
    assert kept["status"] == "FINISHED" and kept["tags"]
    assert {x["step"] for x in kept["metrics"] if x["key"] == "train/loss"} >= {30, 40}
    # Outside git-tracked files: the project's .gitignore covers it.
    assert subprocess.run(["git", "check-ignore", "-q", "reports/mlflow_unsent.json"], cwd=REPO).returncode == 0
    restart(stack)
    evaluate = repro(m, "evaluate")
    assert f"MLflow: replayed into run {first_run}" in evaluate.stdout, evaluate.stdout
    assert "registered model 'faults-model' version 1" in evaluate.stdout, evaluate.stdout
    assert not (m.path / "reports/mlflow_unsent.json").exists() and WAITING not in evaluate.stderr
    client = client_for(m, monkeypatch)
    (version,) = versions_of(client, family(client, first_run))
    run = client.get_run(version.run_id)
    assert run.info.status == "FINISHED" and "test/test_2016_flickr/bleu" in run.data.metrics
    assert "valid_bleu" in client.get_run(first_run).data.metrics   # tune's record, sent late
    first_losses = sorted(x.step for x in client.get_metric_history(first_run, "train/loss"))
    curve = [int(line.split(",")[0]) for line in (m.path / "reports/train_curve.csv").read_text().splitlines()[1:]]
    assert first_losses == curve and curve[-1] == 40   # each loss once: the ones sent and the replayed ones
    newest = sorted((m.path / "models/checkpoints").glob("*.pt"))[-1]
    training = client.get_run(first_run).data
    assert training.tags["link.checkpoint_sha256"] == file_sha256(newest)   # the replayed link
    assert "average/checkpoints_used" in training.metrics   # average found the run through it

    # 2. train.max_steps raised: the finished run's model trains into a new run linked to it; the
    # server killed at update 50 and back only after the whole pipeline: everything waits, the
    # stages say so and end 0, the gate sees no challenger yet, the replay registers version 2.
    changed = yaml.safe_load((m.path / "params.yaml").read_text())
    changed["train"]["max_steps"] = 60
    (m.path / "params.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    text = train_killing_the_server(stack, m, 50)
    assert "resuming from step 40" in text, text
    second_run = next(line.split()[2] for line in text.splitlines() if line.startswith("MLflow: run "))
    assert second_run != first_run and f"continues the model of run {first_run}" in text, text
    assert "logging the continued checkpoint's curve (" in text and f"from run {first_run}) into the new run" in text
    rest = repro(m)   # average, tune, evaluate
    assert rest.stderr.count(WAITING) == 3 and "MLflow replay of" not in rest.stderr, rest.stderr
    assert any("registration of 'faults-model'" in line for line in rest.stderr.splitlines() if WAITING in line)
    assert pending_challenger(m.path, paths.AVERAGED_MODEL).startswith("no challenger yet")
    assert "up to date" in m.dvc("status").stdout   # DVC is done: only the queue knows, and says so
    restart(stack)
    replay = m.run(PYTHON, "-m", "pipeline.tracking.replay")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "registered model 'faults-model' version 2" in replay.stdout, replay.stdout
    for noise in ("🏃", "🧪", "Successfully registered", "Created version", "%|", "INFO mlflow"):   # ours only
        assert noise not in replay.stdout + replay.stderr, (noise, replay.stdout + replay.stderr)
    assert not (m.path / "reports/mlflow_unsent.json").exists()
    assert not any((m.path / "reports/mlflow_unsent").glob("*/"))   # the records' copies went with them
    assert pending_challenger(m.path, paths.AVERAGED_MODEL) == ""
    (version,) = versions_of(client, family(client, second_run))
    assert str(version.version) == "2"
    second = client.get_run(second_run)
    assert second.data.tags["lineage.continued_from_run"] == first_run and second.data.params["train.max_steps"] == "60"
    assert sorted(x.step for x in client.get_metric_history(second_run, "train/loss"))[-1] == 60
    # Version 1's run is as it was: its curves end at 40, its params say 40, it is finished.
    first = client.get_run(first_run)
    assert sorted(x.step for x in client.get_metric_history(first_run, "train/loss")) == first_losses
    assert first.data.params["train.max_steps"] == "40" and first.info.status == "FINISHED"

    server_away_when_training_starts(stack, m, client, second_run)
    refused_and_repeated(m, client)


def server_away_when_training_starts(stack: Stack, m: Machine, client, previous_run: str) -> None:
    """3. ``train.max_steps`` raised again, the server killed before the training starts: the
    training finds no run, keeps its own and queues it at its end, the average record waits behind
    it; the server back, tune's replay makes the run (linked to the finished run it continues),
    average and evaluate log into it and evaluate registers version 3."""
    changed = yaml.safe_load((m.path / "params.yaml").read_text())
    changed["train"]["max_steps"] = 80
    (m.path / "params.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    kill_mlflow(stack)
    try:
        away = repro(m, "train", "average")
    finally:
        restart(stack)   # also when the stages failed: the session's other tests need the server
    assert "resuming from step 60" in away.stdout and "MLflow: run " not in away.stdout, away.stdout
    assert "warning: MLflow: no run at " in away.stderr and away.stderr.count(WAITING) == 2, away.stderr
    queue = json.loads((m.path / "reports/mlflow_unsent.json").read_text())
    assert [r["stage"] for r in queue["records"]] == ["train", "average"]
    back = repro(m, "tune", "evaluate")
    made = next(line for line in back.stdout.splitlines() if "from the training's record" in line)
    third_run = made.split()[3]
    assert made.startswith("MLflow: made run "), back.stdout
    assert "registered model 'faults-model' version 3" in back.stdout, back.stdout
    assert not (m.path / "reports/mlflow_unsent.json").exists()
    third = client.get_run(third_run)
    assert third.info.status == "FINISHED" and third.data.params["train.max_steps"] == "80"
    assert third.data.tags["lineage.continued_from_run"] == previous_run
    assert third.data.tags["link.checkpoint_sha256"] and "link.model_sha256" in third.data.tags
    assert sorted(x.step for x in client.get_metric_history(third_run, "train/loss"))[-1] == 80
    (version,) = versions_of(client, family(client, third_run))
    assert str(version.version) == "3"
    assert "test/test_2016_flickr/bleu" in client.get_run(version.run_id).data.metrics


def refused_and_repeated(m: Machine, client) -> None:
    """4. A wrong password: a stage run by plain ``dvc repro`` stops at its start with one line and
    exit 2, nothing queued. A forced re-evaluation of the same model registers no second version,
    and prints our lines only."""
    wrong = {**m.env, "MLFLOW_TRACKING_PASSWORD": "wrong"}
    model = m.path / paths.AVERAGED_MODEL
    refused = subprocess.run([str(BIN / "dvc"), "repro", "-s", "-f", "average"], cwd=m.path, env=wrong,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "exited with 2" in refused.stderr, refused.stdout + refused.stderr
    uri = m.env["MLFLOW_TRACKING_URI"]
    assert [line for line in refused.stderr.splitlines() if line.startswith("error: ")] == [
        f"error: the MLflow server at {uri} answered 401: its credentials were refused (MLFLOW_TRACKING_USERNAME "
        "and MLFLOW_TRACKING_PASSWORD; with the team's stack, `source .stack/env`)"], refused.stderr
    assert not (m.path / "reports/mlflow_unsent.json").exists()
    assert "averaged " not in refused.stdout   # stopped before any work
    # DVC removed the stage's output before running it, as for any stage that fails; its cache has it.
    assert m.dvc("checkout").returncode == 0 and "up to date" in m.dvc("status").stdout

    versions = {str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")}
    again = repro(m, "-s", "-f", "evaluate")
    assert f"MLflow: {MODEL!r} version 3 already holds this model (sha256 " in again.stdout, again.stdout
    assert "not registered again" in again.stdout and "registered model" not in again.stdout
    assert {str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")} == versions
    (version,) = [v for v in client.search_model_versions(f"name = '{MODEL}'") if str(v.version) == "3"]
    assert version.tags["model_sha256"] == file_sha256(model) and len(version.tags["identity_sha256"]) == 64
    for noise in ("🏃", "🧪", "Successfully registered", "Created version", "%|"):   # MLflow's own lines
        assert noise not in again.stdout + again.stderr, (noise, again.stdout + again.stderr)


def one_error_line(result: subprocess.CompletedProcess, *words: str, service: str = "MLflow") -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    # Python warnings printed while importing MLflow's pyfunc aside, one line: the error.
    lines = [line for line in result.stderr.splitlines() if "Warning" not in line and "color_warning(" not in line]
    assert len(lines) == 1 and lines[0].startswith(f"error: the {service} server at "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["pipeline.serving.server", "--port", "1"], ["pipeline.experiments.compare"]],
                         ids=["serve-model", "compare"])
def test_refused_or_silent_server_is_one_line_and_exit_2(stack, command):
    env = {**os.environ, "PYTHONPATH": str(REPO), **stack.client_env}
    wrong = {**env, "MLFLOW_TRACKING_PASSWORD": "wrong"}
    refused = subprocess.run([PYTHON, "-m", *command], cwd=REPO, env=wrong, capture_output=True, text=True,
                             timeout=120)
    one_error_line(refused, "401", "MLFLOW_TRACKING_PASSWORD")
    assert env["MLFLOW_TRACKING_PASSWORD"] not in refused.stdout + refused.stderr
    silent = {**env, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}
    away = subprocess.run([PYTHON, "-m", *command], cwd=REPO, env=silent, capture_output=True, text=True, timeout=120)
    one_error_line(away, "does not answer")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

