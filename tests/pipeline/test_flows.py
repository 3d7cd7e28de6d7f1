"""pipeline/flows against Prefect's test harness (a real Prefect API on a temporary database) and
real MLflow stores: the training flow on the real stages of a tiny config (one pipeline run for
the module), the first promotion, a fine-tuning retraining from that champion, the promotion gate
on synthetic translations with real sacrebleu and real registry versions (deciding on the
development set, never on a test set), the served deployment's schedule, and a failing stage."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.config.params import FlowsParams
from pipeline.flows import finetune, gate
from pipeline.flows.gate import Systems, promote_if_better
from pipeline.tracking.store import CHAMPION_ALIAS

from .conftest import MIRROR, ONE_POINT_DECODING, make_workspace, needs_mirror, tiny_params

pytestmark = pytest.mark.fast

FLOWS = {"schedule_cron": "15 4 * * 2", "schedule_timezone": "Europe/Berlin", "deployment_name": "test-retraining",
         "significance": 0.05, "bootstrap_resamples": 1000, "gate_set": ""}
MODEL = "test-translator"


@pytest.fixture(scope="session")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def prefect_client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def flush_logs() -> None:
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all()


def artifacts(key: str, flow_run_id) -> list:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with prefect_client() as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def run_logs(flow_run_id=None, task_run_id=None) -> list[str]:
    """The messages logged by a flow run's tasks (or by one task run), read back from the API."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTaskRunId

    flush_logs()
    log_filter = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]) if flow_run_id else None,
                           task_run_id=LogFilterTaskRunId(any_=[task_run_id]) if task_run_id else None)
    messages: list[str] = []
    with prefect_client() as client:
        while page := client.read_logs(log_filter, limit=200, offset=len(messages)):
            messages += [log.message for log in page]
    return messages


def mlflow_client() -> MlflowClient:
    return MlflowClient(os.environ["MLFLOW_TRACKING_URI"], os.environ["MLFLOW_TRACKING_URI"])


def task_runs(name: str) -> list:
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with prefect_client() as client:
        return client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])))


def recorded_task_runs(name: str, done: Callable[[list], bool], timeout_s: float = 30.0) -> list:
    """``task_runs(name)`` once ``done`` holds for them (or ``timeout_s`` has passed): the server records
    a task run's states from the events its engine emits (Prefect's TaskRunRecorder), so the last state
    can reach the API after the flow has returned."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()
    deadline = time.monotonic() + timeout_s
    while not done(runs := task_runs(name)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return runs


# ----------------------------------------------------------------------------- the real pipeline


@pytest.fixture(scope="module")
def ws(tmp_path_factory, prefect_api):
    """A tiny git+DVC workspace whose environment (MLflow store, data mirror) is this process's."""
    if not (MIRROR / "data/task1/raw/train.en.gz").is_file():
        pytest.skip(f"the Multi30k mirror is not at {MIRROR}")
    # Tune's one point (the flows run it, they do not judge it); evaluate's own settings, which the gate repeats.
    params = tiny_params({"flows": FLOWS, "tune": ONE_POINT_DECODING["tune"]})
    root, env = make_workspace(tmp_path_factory.mktemp("flows") / "repo", params)
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k not in env]:
            mp.delenv(key)
        for key, value in env.items():
            if os.environ.get(key) != value:
                mp.setenv(key, value)
        yield root


@pytest.fixture(scope="module")
def trained(ws):
    """The training flow, run once on the real stages."""
    from pipeline.flows import training_pipeline

    state = training_pipeline(workdir=str(ws), return_state=True)
    assert state.is_completed(), state.message
    return state


@pytest.fixture(scope="module")
def first_retraining(trained, ws):
    """The retraining flow after the training flow: no incoming data, nothing for DVC to redo, no champion."""
    from pipeline.flows import retraining

    state = retraining(workdir=str(ws), return_state=True)
    assert state.is_completed(), state.message
    return state


@needs_mirror
def test_training_flow_runs_the_stages_and_returns_the_metrics(trained, ws):
    import json

    metrics = trained.result()
    assert metrics == json.loads((ws / "reports" / "metrics.json").read_text())
    assert set(metrics) == {"test", "dev", "decoding"} and 0 <= metrics["test"]["test_2016_flickr"]["bleu"] <= 100
    tuned = json.loads((ws / "reports" / "tune.json").read_text())["chosen"]
    detail = json.loads((ws / "reports" / "evaluate" / "scores.json").read_text())
    assert metrics["decoding"]["alpha"] == tuned["alpha"] and detail["decoding"]["alpha_from"] == "tune"
    (artifact,) = artifacts("training-metrics", trained.state_details.flow_run_id)
    assert artifact.type == "markdown" and "| test_2016_flickr | test |" in artifact.data
    assert "| val | validation |" in artifact.data and "(params), alpha" in artifact.data
    assert f"{metrics['test']['test_2016_flickr']['bleu']}" in artifact.data
    # the stages' own output streamed into the task logs, tune between average and evaluate
    logs = run_logs(flow_run_id=trained.state_details.flow_run_id)
    assert "Running stage 'train':" in logs and any(line.startswith("averaged 3 checkpoint(s)") for line in logs)
    ran = [line for line in logs if line.startswith("Running stage")]
    assert ran[-2:] == ["Running stage 'tune':", "Running stage 'evaluate':"]
    assert any(line.startswith("chosen: ") and "beam " in line for line in logs)


@needs_mirror
def test_a_registered_version_translates_as_the_evaluate_stage_did(trained, ws):
    """The gate's champion side: the version's own checkpoint and tokenizer, and its own registered
    decoding settings (beam 2 from params, alpha and stopping rule from tune) on the validation and test sets."""
    import json

    import mlflow

    client = mlflow_client()
    version = client.get_model_version(MODEL, "1")
    decoding = json.loads((ws / "reports" / "metrics.json").read_text())["decoding"]
    sources = {name: (ws / "data" / "corpus" / f"{name}.en").read_text().splitlines()
               for name in ("val", "test_2016_flickr")}
    got, used = gate.translate_with_version(client, MODEL, "1", sources, beam_size=None, alpha=None, max_len_b=8,
                                            batch_sentences=250, tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    assert used == {"beam_size": 2, **{k: decoding[k] for k in ("alpha", "stopping", "engine", "compute_type")},
                    "text_form": "raw"}
    for name in sources:
        logged = mlflow.artifacts.download_artifacts(run_id=version.run_id, artifact_path=f"translations/{name}.de",
                                                     tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
        assert got[name] == Path(logged).read_text().splitlines() == \
            (ws / "reports" / "translations" / f"{name}.de").read_text().splitlines()


@needs_mirror
def test_first_complete_model_is_promoted(first_retraining, ws):
    summary = first_retraining.result()
    assert summary["verdict"] == "first-model" and summary["promoted"]
    client = mlflow_client()
    champion = client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS)
    assert str(champion.version) == summary["challenger_version"] == "1"
    tags = client.get_run(champion.run_id).data.tags
    assert tags["gate.decision"] == "first-model" and tags["gate.champion_version"] == "none"
    assert tags["gate.prefect_flow_run_id"] == str(first_retraining.state_details.flow_run_id)
    (artifact,) = artifacts("promotion-gate", first_retraining.state_details.flow_run_id)
    assert "first-model" in artifact.data


@needs_mirror
def test_failing_stage_fails_the_flow_and_promotes_nothing(first_retraining, ws):
    """Misaligned incoming data: versioned by the flow, rejected by the download stage (exit 2, no
    retry), the flow fails with the stage's error, the champion stays."""
    from pipeline.flows import retraining

    client = mlflow_client()
    versions_before = len(client.search_model_versions(f"name = '{MODEL}'"))
    champion_before = client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version
    incoming = ws / "data" / "incoming"
    (incoming / "bad.en").write_text("one\ntwo\nthree\n")
    (incoming / "bad.de").write_text("eins\nzwei\n")
    try:
        state = retraining(workdir=str(ws), return_state=True)
        assert state.is_failed()
        assert (incoming / "bad.en.dvc").is_file() and (incoming / "bad.de.dvc").is_file()   # versioned first
        runs = recorded_task_runs("dvc repro download", lambda runs: any(t.state.is_failed() for t in runs))
        (failed,) = [t for t in runs if t.state.is_failed()]
        assert failed.run_count == 1   # exit 2 is a user error: not retried
        error = "error: misaligned corpus: data/incoming/bad.en has 3 lines but data/incoming/bad.de has 2"
        assert error in run_logs(task_run_id=failed.id)          # the stage's stderr, streamed
        assert error in failed.state.message                     # and the task's failure
        assert client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version == champion_before
        assert len(client.search_model_versions(f"name = '{MODEL}'")) == versions_before
        assert not artifacts("promotion-gate", state.state_details.flow_run_id)
    finally:
        for name in ("bad.en", "bad.de", "bad.en.dvc", "bad.de.dvc", ".gitignore"):   # the folder as it was
            (incoming / name).unlink(missing_ok=True)


@needs_mirror
def test_overrides_run_a_dvc_experiment_and_a_bad_value_fails_before_it(first_retraining, ws):
    from pipeline.flows import training_pipeline

    client = mlflow_client()
    champion_before = client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version
    original = (ws / "params.yaml").read_text()
    experiments_before = len(task_runs("dvc exp run"))
    outputs_before = (ws / "reports/metrics.json").read_bytes()
    try:
        # checked with the override applied before DVC starts: no experiment, no output removed
        state = training_pipeline(workdir=str(ws), overrides=["evaluate.beam_size=0"], return_state=True)
        assert state.is_failed()
        assert "params.yaml: evaluate.beam_size must be a positive integer, got 0" in state.message
        assert len(task_runs("dvc exp run")) == experiments_before
        assert (ws / "params.yaml").read_text() == original
        assert (ws / "reports/metrics.json").read_bytes() == outputs_before

        state = training_pipeline(workdir=str(ws), overrides=["evaluate.beam_size=1"], return_state=True)
        assert state.is_completed(), state.message
        logs = run_logs(flow_run_id=state.state_details.flow_run_id)
        assert [line for line in logs if line.startswith("Running stage")] == ["Running stage 'evaluate':"]
        assert state.result()["test"]["test_2016_flickr"]["bleu"] >= 0
        # the experiment registered a new version, the champion did not move
        assert client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version == champion_before
    finally:
        (ws / "params.yaml").write_text(original)


def incoming_pairs(first: int, count: int) -> tuple[list[str], list[str]]:
    """Multi30k training pairs after the workspace's first 300 (data.limit_train_pairs): new data."""
    import gzip

    sides = []
    for lang in ("en", "de"):
        with gzip.open(MIRROR / f"data/task1/raw/train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append([line.rstrip("\n") for _, line in zip(range(first + count), f)][first:])
    return sides[0], sides[1]


@needs_mirror
def test_finetune_retraining_starts_from_the_champion_with_its_tokenizer(first_retraining, ws, tmp_path):
    """flows.retrain_mode finetune with a champion and new incoming pairs: the champion's model and
    tokenizer are downloaded into models/init/, the tokenizer stage copies the champion's
    tokenizer (a retrained one would differ: the corpus changed), the training starts from the
    champion's weights, and the gate judges the result against the champion."""
    import hashlib

    import yaml

    from pipeline.config.params import load_params
    from pipeline.flows import retraining

    client = mlflow_client()
    champion = client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS)
    champion_files = gate.version_files(client, MODEL, str(champion.version), tmp_path,
                                        os.environ["MLFLOW_TRACKING_URI"])
    original = (ws / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["flows"]["retrain_mode"] = "finetune"
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    incoming = ws / "data" / "incoming"
    src, tgt = incoming_pairs(300, 60)
    (incoming / "more.en").write_text("\n".join(src) + "\n")
    (incoming / "more.de").write_text("\n".join(tgt) + "\n")
    try:
        started = datetime.now(UTC)
        state = retraining(workdir=str(ws), return_state=True)
        assert state.is_completed(), state.message
        summary = state.result()
        plan = summary["retrain"]
        assert plan["mode"] == "finetune" and plan["champion_version"] == str(champion.version)

        # The champion's files, versioned, and the params that name them (left by the experiment).
        init, spm = ws / plan["init_from"], ws / plan["model_from"]
        assert init.parent.parent == ws / "models" / "init" and init.parent == spm.parent
        assert init.read_bytes() == champion_files["model"].read_bytes()
        assert spm.read_bytes() == champion_files["tokenizer"].read_bytes()
        assert (init.parent.parent / f"{init.parent.name}.dvc").is_file()
        after = load_params(ws / "params.yaml")
        assert (after.train.init_from, after.tokenizer.model_from) == (plan["init_from"], plan["model_from"])

        # The tokenizer stage reused the champion's tokenizer on the grown corpus.
        assert (ws / "data/tokenizer/spm.model").read_bytes() == champion_files["tokenizer"].read_bytes()
        corpus = (ws / "data/corpus/train.en").read_text().splitlines()
        assert len(corpus) == 360 and corpus[-60:] == src

        # The challenger started from the champion's weights: the file's hash on its run, and a
        # first logged loss (mean of steps 1-10) where the champion ended, not where it began.
        challenger = client.get_model_version(MODEL, summary["challenger_version"])
        run = client.get_run(challenger.run_id)
        assert run.data.params["train.init_from"] == plan["init_from"]
        assert run.data.params["tokenizer.model_from"] == plan["model_from"]
        sha = hashlib.sha256(champion_files["model"].read_bytes()).hexdigest()
        assert run.data.tags["train.init_sha256"] == plan["init_sha256"] == sha
        assert run.data.tags["retrain.mode"] == "finetune"
        assert run.data.tags["retrain.init_version"] == str(champion.version)
        champion_loss = {m.step: m.value for m in client.get_metric_history(champion.run_id, "train/loss")}
        challenger_loss = {m.step: m.value for m in client.get_metric_history(challenger.run_id, "train/loss")}
        assert champion_loss[40] - 0.15 < challenger_loss[10] < (champion_loss[10] + champion_loss[40]) / 2
        # one "dvc exp run" task (in the training-pipeline subflow) ran the stages with the init params
        runs = recorded_task_runs("dvc exp run", lambda runs: any(t.state.is_completed() and t.start_time >= started
                                                                  for t in runs))
        experiment = max((t for t in runs if t.state.is_completed()), key=lambda t: t.start_time)
        assert experiment.start_time >= started
        logs = run_logs(task_run_id=experiment.id)
        assert f"$ dvc exp run -S train.init_from={plan['init_from']} -S tokenizer.model_from={plan['model_from']}" \
            in logs[0]
        assert any(line.startswith(f"initialised from {plan['init_from']} (sha256 {sha[:12]})") for line in logs)

        # The gate ran: the challenger against the champion, decided on the validation set, the
        # test set compared and reported.
        assert summary["verdict"] in ("promoted", "rejected")
        assert [(c["set"], c["decides"]) for c in summary["comparisons"]] == [("val", True),
                                                                              ("test_2016_flickr", False)]
        assert summary["gate_set"] == "val" and " on val, p=" in summary["reason"]
        assert summary["champion_version"] == str(champion.version) != summary["challenger_version"]
        assert run.data.tags["gate.decision"] == summary["verdict"] and run.data.tags["gate.gate_set"] == "val"
        assert run.data.tags["gate.reported_sets"] == '["test_2016_flickr"]'
        assert run.data.tags["gate.champion_decoding"].startswith("beam 2, alpha ")
        (artifact,) = artifacts("promotion-gate", state.state_details.flow_run_id)
        assert "mode: **finetune**" in artifact.data and f"champion version {champion.version}" in artifact.data
    finally:
        (ws / "params.yaml").write_text(original)
        for name in ("more.en", "more.de", "more.en.dvc", "more.de.dvc", ".gitignore"):
            (incoming / name).unlink(missing_ok=True)


@pytest.mark.pipeline
def test_finetune_without_a_champion_trains_from_scratch(registry, tmp_path):
    """No champion yet: finetune falls back to scratch (and says so); scratch clears the init keys."""
    import yaml

    from pipeline.config.params import load_params

    client, _ = registry
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_params({"flows": {**FLOWS, "retrain_mode": "finetune"}})))
    params = load_params(path)
    plan = finetune.plan_retraining(client, params, tmp_path)
    assert (plan.requested, plan.mode, plan.init_from, plan.model_from) == ("finetune", "scratch", "", "")
    assert "no champion" in plan.note and "no champion" in plan.markdown()
    assert plan.overrides(params) == [] and plan.tags()["retrain.mode"] == "scratch"
    assert not (tmp_path / "models").exists()
    # init keys left set by an earlier fine-tuning are cleared
    for name in ("model.pt", "spm.model"):
        (tmp_path / "models/init/v1").mkdir(parents=True, exist_ok=True)
        (tmp_path / "models/init/v1" / name).write_bytes(b"x")
    path.write_text(yaml.safe_dump(tiny_params({"flows": FLOWS, "train": {"init_from": "models/init/v1/model.pt"},
                                                "tokenizer": {"model_from": "models/init/v1/spm.model"}})))
    params = load_params(path)
    assert finetune.plan_retraining(client, params, tmp_path).overrides(params) == ["train.init_from=",
                                                                                   "tokenizer.model_from="]


# ----------------------------------------------------------------------------- the gate


@pytest.fixture
def registry(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri, uri)
    experiment = client.create_experiment("gate", artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_registered_model(MODEL)

    def version() -> str:
        run = client.create_run(experiment)
        client.set_terminated(run.info.run_id)
        return str(client.create_model_version(MODEL, f"{run.info.artifact_uri}/translator", run.info.run_id).version)

    return client, version


def corpus(seed: int = 0, n: int = 300) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(400)]
    return [" ".join(rng.choice(vocab) for _ in range(12)) for _ in range(n)]


def noisy(references: list[str], rate: float, seed: int) -> list[str]:
    """The references with ``rate`` of their words replaced: lower rate, higher BLEU."""
    rng = random.Random(seed)
    return [" ".join(w if rng.random() > rate else f"x{rng.randrange(1000)}" for w in s.split()) for s in references]


REFS = {"main": corpus(1), "test": corpus(2)}
CHAMPION = {name: noisy(refs, 0.5, 10) for name, refs in REFS.items()}


def judge(client, challenger: str, hyps: dict[str, list[str]]):
    """The gate with "main" as the gate set (a development set) and "test" as a reported test set."""
    champion = gate.current_champion(client, MODEL)
    systems = {name: Systems(REFS[name], CHAMPION[name], hyps[name]) for name in REFS}
    return promote_if_better(client, MODEL, client.get_model_version(MODEL, challenger), champion, systems,
                             gate_set="main", significance=0.05, resamples=1000)


def test_gate_promotes_better_rejects_worse_keeps_champion_on_tie(registry):
    client, new_version = registry
    first = new_version()
    decision = promote_if_better(client, MODEL, client.get_model_version(MODEL, first), None, None,
                                 gate_set="main", significance=0.05, resamples=1000)
    assert decision.verdict == "first-model"
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == first

    better = new_version()
    decision = judge(client, better, {name: noisy(refs, 0.3, 20) for name, refs in REFS.items()})
    assert decision.verdict == "promoted", decision.reason
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == better
    tags = client.get_run(client.get_model_version(MODEL, better).run_id).data.tags
    assert tags["gate.decision"] == "promoted" and tags["gate.champion_version"] == first
    assert float(tags["gate.main.p_value"]) < 0.05
    assert float(tags["gate.main.challenger_bleu"]) > float(tags["gate.main.champion_bleu"])
    assert client.get_model_version(MODEL, better).tags["gate.decision"] == "promoted"

    # the champion's outputs are CHAMPION from here on (the gate only sees the translations)
    worse = new_version()
    decision = judge(client, worse, {name: noisy(refs, 0.7, 30) for name, refs in REFS.items()})
    assert decision.verdict == "rejected" and decision.reason.startswith("not better")
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == better
    tags = client.get_run(client.get_model_version(MODEL, worse).run_id).data.tags
    assert tags["gate.decision"] == "rejected" and float(tags["gate.main.p_value"]) < 0.05

    tie = new_version()
    decision = judge(client, tie, dict(CHAMPION))
    assert decision.verdict == "rejected"
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == better
    tags = client.get_run(client.get_model_version(MODEL, tie).run_id).data.tags
    assert tags["gate.main.p_value"] == "1.0000"
    assert tags["gate.main.champion_bleu"] == tags["gate.main.challenger_bleu"]


def test_a_challenger_better_on_test_but_not_on_the_development_set_is_not_promoted(registry):
    """Held-out means held out: the gate set decides; a test set is compared and reported, never read
    by the decision, whichever way it points."""
    client, new_version = registry
    champion = new_version()
    client.set_registered_model_alias(MODEL, CHAMPION_ALIAS, champion)
    test_winner = new_version()
    decision = judge(client, test_winner, {"main": noisy(REFS["main"], 0.5, 40),     # the champion's quality on dev
                                           "test": noisy(REFS["test"], 0.2, 41)})  # far better on the test set
    by_set = {c.test_set: c for c in decision.comparisons}
    assert by_set["test"].better(0.05) and not by_set["main"].better(0.05)
    assert decision.verdict == "rejected" and "on main" in decision.reason and "on test" not in decision.reason
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == champion
    tags = client.get_run(client.get_model_version(MODEL, test_winner).run_id).data.tags
    assert tags["gate.decision"] == "rejected" and tags["gate.gate_set"] == "main"
    assert tags["gate.reported_sets"] == '["test"]' and float(tags["gate.test.p_value"]) < 0.05
    assert "| main | decides |" in decision.markdown() and "| test | reported |" in decision.markdown()

    # the other way round: better on the development set, worse on the test set: promoted
    dev_winner = new_version()
    decision = judge(client, dev_winner, {"main": noisy(REFS["main"], 0.3, 42), "test": noisy(REFS["test"], 0.7, 43)})
    assert {c.test_set: c for c in decision.comparisons}["test"].worse(0.05)
    assert decision.verdict == "promoted", decision.reason
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == dev_winner

    # a different sample of the champion's own quality is no evidence of a better model
    same_quality = new_version()
    decision = judge(client, same_quality, {name: noisy(refs, 0.5, 50) for name, refs in REFS.items()})
    assert decision.verdict == "rejected"
    assert str(client.get_model_version_by_alias(MODEL, CHAMPION_ALIAS).version) == dev_winner
    # no translations of the gate set: nothing is judged
    with pytest.raises(gate.GateError, match="gate set main"):
        promote_if_better(client, MODEL, client.get_model_version(MODEL, new_version()),
                          gate.current_champion(client, MODEL), {"test": Systems(REFS["test"], CHAMPION["test"],
                                                                                  CHAMPION["test"])},
                          gate_set="main", significance=0.05, resamples=1000)
    # the champion against itself: nothing recorded, nothing moved
    assert judge(client, dev_winner, dict(CHAMPION)).verdict == "unchanged"


def test_models_of_the_literatures_text_form_are_judged_on_their_tokens_as_written():
    """Tokenized systems (lc.norm.tok references and output) score by multi-bleu.perl's BLEU on the text
    as it is; sacreBLEU's 13a tokenizer would split the escapes (``&apos;`` -> ``& apos ;``) and score
    them as matches of their own."""
    refs = [f"{line} &apos;s &quot; ok &quot; ." for line in REFS["main"]]
    champion = [f"{line} &apos;s &quot; ok &quot; ." for line in CHAMPION["main"]]
    challenger = [f"{line} &apos;s &quot; ok &quot; ." for line in noisy(REFS["main"], 0.3, 20)]
    as_written = gate.paired_bootstrap("main", Systems(refs, champion, challenger, tokenized=True), 200)
    detokenized = gate.paired_bootstrap("main", Systems(refs, champion, challenger), 200)
    from pipeline.scoring.paper_bleu import multi_bleu

    assert as_written.challenger_bleu == round(multi_bleu(challenger, refs).score, 2)
    assert as_written.champion_bleu == round(multi_bleu(champion, refs).score, 2)
    assert detokenized.challenger_bleu != as_written.challenger_bleu
    assert as_written.better(0.05)


def test_models_of_different_text_forms_are_never_compared():
    gate.check_comparable("lc_norm_tok", "lc_norm_tok", MODEL, "3")
    gate.check_comparable("raw", "raw", MODEL, "3")
    with pytest.raises(gate.GateError) as err:
        gate.check_comparable("raw", "lc_norm_tok", MODEL, "3")
    message = str(err.value)
    assert f"the champion ({MODEL} version 3) writes 'raw' text and the challenger 'lc_norm_tok' text" in message
    assert "nothing is promoted" in message and "\n" not in message


def test_gate_refuses_partial_runs(registry):
    client, new_version = registry
    version = new_version()
    run_id = client.get_model_version(MODEL, version).run_id
    client.update_run(run_id, "RUNNING")
    with pytest.raises(gate.GateError, match="not FINISHED"):
        gate.challenger_version(client, MODEL, run_id)
    other = client.create_run(client.get_run(run_id).info.experiment_id)
    with pytest.raises(gate.GateError, match="nothing to promote"):
        gate.challenger_version(client, MODEL, other.info.run_id)


# ----------------------------------------------------------------------------- serving


def test_served_deployment_has_the_configured_schedule_and_survives_a_restart(prefect_api, tmp_path):
    from pipeline.flows import serving

    flows = FlowsParams(**FLOWS)
    first_id = serving.serve_retraining(tmp_path, flows, run_once=True)
    with prefect_client() as client:
        deployment = client.read_deployment_by_name(f"retraining/{flows.deployment_name}")
    assert deployment.id == first_id
    (schedule,) = deployment.schedules
    assert schedule.schedule.cron == "15 4 * * 2" and schedule.schedule.timezone == "Europe/Berlin"
    assert schedule.active and deployment.parameters == {"workdir": str(tmp_path)}
    assert deployment.entrypoint == "pipeline.flows.pipelines.retraining"
    assert deployment.global_concurrency_limit.limit == 1
    assert deployment.paused   # the runner stopped: paused, not deleted

    # a restart of the serving process: the same deployment, one schedule, active again
    deployment_id = serving.retraining_deployment(tmp_path, flows).apply()
    with prefect_client() as client:
        again = client.read_deployment_by_name(f"retraining/{flows.deployment_name}")
    assert deployment_id == first_id == again.id and not again.paused
    assert [s.schedule.cron for s in again.schedules] == ["15 4 * * 2"]


def _sqlalchemy_2_1() -> bool:
    import sqlalchemy

    return tuple(int(x) for x in sqlalchemy.__version__.split(".")[:2]) >= (2, 1)


@pytest.mark.xfail(_sqlalchemy_2_1(), strict=True, reason="Prefect 3.8's scheduler fails with SQLAlchemy 2.1 "
                   "(bulk insert of a hybrid property); pin SQLAlchemy<2.1")
def test_the_server_scheduler_turns_the_schedule_into_runs(prefect_api, tmp_path):
    """What the server's scheduler service does on every pass, called on the harness's database."""
    import asyncio
    from zoneinfo import ZoneInfo

    from prefect.server.database import provide_database_interface
    from prefect.server.models.deployments import schedule_runs

    from pipeline.flows import serving

    flows = FlowsParams(**{**FLOWS, "deployment_name": "scheduler-check"})
    deployment_id = serving.retraining_deployment(tmp_path, flows).apply()

    async def schedule():
        # BEGIN IMMEDIATE (SQLite's write lock first, waited for): a deferred transaction that read before the
        # harness's server wrote cannot upgrade to a write and fails at once with "database is locked".
        async with provide_database_interface().session_context(begin_transaction=True,
                                                                with_for_update=True) as session:
            return await schedule_runs(session, deployment_id=deployment_id)

    assert asyncio.run(schedule())
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with prefect_client() as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    assert runs and all(r.state.is_scheduled() and r.parameters == {"workdir": str(tmp_path)} for r in runs)
    for run in runs:   # "15 4 * * 2" in Europe/Berlin: Tuesdays 04:15 local time
        local = run.expected_start_time.astimezone(UTC).astimezone(ZoneInfo("Europe/Berlin"))
        assert (local.weekday(), local.hour, local.minute) == (1, 4, 15)


@pytest.mark.parametrize("flows, message", [
    ({"schedule_cron": "0 3 * *"}, "must have 5 fields"),
    ({"schedule_cron": "61 3 * * 1"}, "not a valid cron expression"),
    ({"schedule_timezone": "Mars/Olympus"}, "not an IANA time zone"),
    ({"significance": 1.5}, "significance must be in"),
    ({"bootstrap_resamples": 10}, "too few for significance"),
    ({"retrain_mode": "continue"}, "flows.retrain_mode must be one of scratch, finetune, got 'continue'"),
    ({"gate_set": "test_2016_flickr"}, "flows.gate_set 'test_2016_flickr' is a test set"),
    ({"guarded_test_sets": []}, "flows.guarded_test_sets was removed: test sets report, they never decide"),
    ({"colour": "blue"}, "unknown key flows.colour"),
])
def test_bad_flows_params_name_the_key(flows, message, tmp_path):
    import yaml

    from pipeline.config.params import ParamsError, load_params

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_params({"flows": flows})))
    with pytest.raises(ParamsError, match=message.replace("(", r"\(")):
        load_params(path)


def test_cli_help_does_not_import_prefect():
    import subprocess
    import sys

    code = ("import runpy, sys\nsys.argv = ['flows', '--help']\ntry:\n    runpy.run_module('pipeline.flows', "
            "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('prefect' in sys.modules)")
    repo = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
