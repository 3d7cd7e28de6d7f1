"""The Prefect flows: ``training_pipeline`` (the DVC stages as tasks) and ``retraining`` (incoming
data, scratch or fine-tuning the champion, the pipeline, the champion/challenger gate on the
development set)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from pipeline.config import paths
from pipeline.config.loader import PARAMS
from pipeline.config.params import Params, load_params
from pipeline.config.params import check as check_params
from pipeline.data.text_files import read_lines
from pipeline.flows.dvc_tasks import (
    RETRIES,
    STAGES,
    check_overrides,
    check_stages,
    default_remote,
    experiment_task,
    run_dvc,
    stage_task,
    version_task,
)
from pipeline.flows.finetune import FINETUNE, RetrainPlan, plan_retraining
from pipeline.flows.gate import (
    NO_CHALLENGER,
    Decision,
    GateError,
    Systems,
    challenger_version,
    current_champion,
    pending_challenger,
    promote_if_better,
    translate_with_version,
)
from pipeline.scoring.reports import (
    DECODING,
    EVALUATE_SCORES,
    LITERATURE_KEY,
    scores_of_dev_sets,
    scores_of_test_sets,
)
from pipeline.text.names import text_form_of
from pipeline.tracking import links, store
from transformer.checkpoint import load_checkpoint

METRICS_ARTIFACT = "training-metrics"
GATE_ARTIFACT = "promotion-gate"


def tracking_uri(root: Path) -> str:
    """The store the stages of ``root`` log into: ``MLFLOW_TRACKING_URI``, else ``root/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / store.DEFAULT_DB}"


def params_of(root: Path) -> Params:
    return load_params(root / PARAMS)


def read_metrics(root: Path, file: Path = paths.METRICS) -> dict[str, dict[str, Any]]:
    """The evaluate stage's ``reports/metrics.json`` (``file``: or its detail, ``reports/evaluate/scores.json``)."""
    file = root / file
    if not file.is_file():
        raise GateError(f"{file} does not exist: the evaluate stage did not finish")
    return json.loads(file.read_text())


def model_run_id(root: Path, experiment: str, client: MlflowClient) -> str:
    """The MLflow run of ``root``'s ``models/model.pt`` in ``client``'s store: the newest run of
    ``experiment`` the average stage tagged with the model's sha256 (the files DVC hashes name no run)."""
    from transformer.atomic import file_sha256

    model = root / paths.AVERAGED_MODEL
    if not model.is_file():
        raise GateError(f"{model} does not exist: the average stage did not finish")
    run_id = links.find_run(links.LINK_MODEL, file_sha256(model), experiment, client)
    if not run_id:
        raise GateError(f"no MLflow run of experiment {experiment!r} in {client.tracking_uri} made {model}: "
                        "nothing to register or promote")
    return run_id


def model_run_ids(root: Path, experiment: str, client: MlflowClient) -> list[str]:
    """Every run of ``experiment`` tagged as a maker of ``root``'s ``models/model.pt``, newest first
    (the same weights can come from more than one run: ``gate.challenger_version``)."""
    from transformer.atomic import file_sha256

    newest = model_run_id(root, experiment, client)
    sha = file_sha256(root / paths.AVERAGED_MODEL)
    experiment_id = client.get_run(newest).info.experiment_id
    others = [r.info.run_id for r in client.search_runs([experiment_id],
                                                        filter_string=f"tags.`{links.LINK_MODEL}` = '{sha}'",
                                                        order_by=["attributes.start_time DESC"], max_results=50)]
    return [newest, *(r for r in others if r != newest)]


def metrics_markdown(metrics: dict[str, Any], run_id: str | None) -> str:
    """``metrics``: ``reports/evaluate/scores.json`` (the signatures, where each setting came from)."""
    rows = [(name, "validation", m) for name, m in scores_of_dev_sets(metrics).items()]
    rows += [(name, "test", m) for name, m in scores_of_test_sets(metrics).items()]
    # The literature's BLEU (Multi30k) in a column of its own, never mixed with sacreBLEU's.
    literature = any(LITERATURE_KEY in m for _, _, m in rows)
    lines = ["# Training pipeline: scores", "",
             "| set | role | BLEU | chrF | sentences |" + (" BLEU lc.tok (the literature's) |" if literature else ""),
             "|---|---|---:|---:|---:|" + ("---:|" if literature else "")]
    for name, role, m in rows:
        lines.append(f"| {name} | {role} | {m.get('bleu', '')} | {m.get('chrf', '')} | {m.get('sentences', '')} |"
                     + (f" {m.get(LITERATURE_KEY, '')} |" if literature else ""))
    d = metrics.get(DECODING)
    if d:
        lines += ["", f"Decoding: beam {d.get('beam_size')} ({d.get('beam_size_from')}), alpha {d.get('alpha')} "
                      f"({d.get('alpha_from')}), stopping {d.get('stopping', 'exact')} "
                      f"({d.get('stopping_from', 'params')}): tune = chosen on the validation set, params = evaluate's"]
    signatures = sorted({m["signature"] for _, _, m in rows if "signature" in m})
    lines += ["", *(f"BLEU signature: `{s}`" for s in signatures)]
    if run_id:
        lines += ["", f"MLflow run: `{run_id}`"]
    return "\n".join(lines) + "\n"


@flow(name="training-pipeline")
def training_pipeline(workdir: str = ".", overrides: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the DVC pipeline in ``workdir``: each stage a task (``dvc repro --single-item``) in the
    DAG's order, or one ``dvc exp run -S key=value ...`` task when ``overrides`` are given.
    Returns ``reports/metrics.json`` (test sets under ``test``, the validation set under ``dev``, the
    decoding settings under ``decoding``) and publishes its detail (``reports/evaluate/scores.json``)
    as the ``training-metrics`` artifact."""
    root = Path(workdir).resolve()
    check_stages(root)
    if overrides:
        check_overrides(overrides)
    # Every section, overrides applied, before DVC runs anything: DVC deletes a stage's outputs before
    # the stage could refuse a bad value.
    check_params(root / PARAMS, list(overrides or []))
    remote = default_remote(root)
    if remote:
        get_run_logger().info("DVC remote %r: each stage pulls what another machine pushed before it runs", remote)
    if overrides:
        experiment_task()(list(overrides), str(root), pull=bool(remote))
    else:
        for stage in STAGES:
            stage_task(stage)(stage, str(root), pull=bool(remote))
    metrics = read_metrics(root)
    try:
        uri = tracking_uri(root)
        run_id: str | None = model_run_id(root, params_of(root).tracking.experiment, MlflowClient(uri, uri))
    except Exception:  # noqa: BLE001 (the artifact only mentions it)
        run_id = None
    create_markdown_artifact(metrics_markdown(read_metrics(root, EVALUATE_SCORES), run_id), key=METRICS_ARTIFACT,
                             description=f"{EVALUATE_SCORES} of the pipeline in {root}")
    scored = {**scores_of_dev_sets(metrics), **scores_of_test_sets(metrics)}
    get_run_logger().info("metrics: %s", json.dumps({k: {"bleu": v.get("bleu"), "chrf": v.get("chrf")}
                                                     for k, v in scored.items()}))
    return metrics


@task(name="retraining mode", cache_policy=NO_CACHE, retries=RETRIES["dvc add"][0],
      retry_delay_seconds=RETRIES["dvc add"][1])
def retrain_plan(workdir: str) -> RetrainPlan:
    """``flows.retrain_mode``: scratch, or fine-tuning the champion, whose model and tokenizer this
    task downloads into ``models/init/`` and versions with ``dvc add`` (like the incoming pairs)."""
    logger = get_run_logger()
    root = Path(workdir)
    uri = tracking_uri(root)
    plan = plan_retraining(MlflowClient(uri, uri), params_of(root), root, tracking_uri=uri)
    logger.info("retraining: %s", plan.describe())
    if plan.mode == FINETUNE:
        run_dvc(["add", str(Path(plan.init_from).parent)], root, logger)
    return plan


def _settings(beam_size: Any, alpha: Any, stopping: Any = "exact", engine: Any = "torch",
              compute_type: Any = None) -> str:
    """``beam 4, alpha 1.2, stopping fairseq, ctranslate2 int8`` (a version without an engine: torch)."""
    return f"beam {beam_size}, alpha {float(alpha):g}, stopping {stopping}, {engine or 'torch'}" + (
        f" {compute_type}" if compute_type else "")


def gate_references(root: Path, split: str, lang: str, literature: bool) -> list[str]:
    """The references the gate scores ``split`` against: the corpus's, or for models of the literature's
    text form upstream's ``lc.norm.tok`` lines (the references stage's; ``GateError`` where there are none)."""
    if not literature:
        return read_lines(root / paths.corpus_file(split, lang))
    from pipeline.data.references import REFERENCES_DIR, tokenized_references

    found = tokenized_references(split, root / REFERENCES_DIR)
    if found is None:
        raise GateError(f"{split} has no lc.norm.tok references to judge models of the literature's text form by")
    return found[0]


@task(name="promotion gate", cache_policy=NO_CACHE)
def promotion_gate(workdir: str, flow_run_id: str = "", extra_tags: dict[str, str] | None = None) -> Decision:
    """Challenger (the model the pipeline just registered) against the registry's champion, decided
    on the gate set (``flows.gate_set``, by default ``data.valid_set``); the test sets are compared
    and reported. The challenger's translations are the evaluate stage's
    (``reports/translations/``); the champion translates the same sources with its own registered
    decoding settings."""
    logger = get_run_logger()
    root = Path(workdir)
    params = params_of(root)
    data, flows = params.data, params.flows
    gate_set = params.gate_set
    name = params.tracking.registered_model
    uri = tracking_uri(root)
    client = MlflowClient(uri, uri)

    metrics = read_metrics(root)
    tests = scores_of_test_sets(metrics)
    scores = {**{t: tests[t] for t in data.test_sets if t in tests},
              **{d: m for d, m in scores_of_dev_sets(metrics).items() if d == gate_set}}
    missing = [t for t in (gate_set, *data.test_sets) if t not in scores]
    if missing:
        raise GateError(f"{paths.METRICS} has no scores for {', '.join(missing)}: the evaluation is partial")
    challenger = challenger_version(client, name, model_run_ids(root, params.tracking.experiment, client))
    logged = client.get_run(challenger.run_id).data.metrics
    for evaluated in (gate_set, *data.test_sets):
        key = f"{'dev' if evaluated == gate_set else 'test'}/{evaluated}/bleu"
        if key not in logged or abs(logged[key] - float(scores[evaluated]["bleu"])) > 0.01:
            raise GateError(f"{name} version {challenger.version} (run {challenger.run_id}) logged {key}="
                            f"{logged.get(key)} but {paths.METRICS} says {scores[evaluated]['bleu']}: "
                            "the registry and the workspace disagree")
    champion = current_champion(client, name)
    systems = None
    d = metrics.get(DECODING, {})
    decoding = ({"challenger": _settings(d["beam_size"], d["alpha"], d.get("stopping", "exact"), d.get("engine"),
                                         d.get("compute_type"))}
                if "beam_size" in d and "alpha" in d else {})
    if champion is not None and str(champion.version) != str(challenger.version):
        sets = [gate_set, *data.test_sets]
        sources = {s: read_lines(root / paths.corpus_file(s, data.src_lang)) for s in sets}
        logger.info("translating %s with the champion, %s version %s", ", ".join(sets), name, champion.version)
        e = params.evaluate
        form = text_form_of(load_checkpoint(root / paths.AVERAGED_MODEL), str(paths.AVERAGED_MODEL))
        champion_hyps, used = translate_with_version(client, name, str(champion.version), sources, None, None,
                                                     e.max_len_b, e.batch_sentences, e.precision, tracking_uri=uri,
                                                     comparable_with=form.name)
        decoding["champion"] = _settings(*(used[k] for k in ("beam_size", "alpha", "stopping", "engine",
                                                             "compute_type")))
        systems = {s: Systems(gate_references(root, s, data.tgt_lang, form.literature), champion_hyps[s],
                              read_lines(root / paths.TRANSLATIONS_DIR / f"{s}.{data.tgt_lang}"), form.literature)
                   for s in sets}
    decision = promote_if_better(client, name, challenger, champion, systems, gate_set=gate_set,
                                 significance=flows.significance, resamples=flows.bootstrap_resamples,
                                 extra_tags={**(extra_tags or {}),
                                             **({"gate.prefect_flow_run_id": flow_run_id} if flow_run_id else {})},
                                 decoding=decoding)
    logger.info("%s: %s", decision.verdict, decision.reason)
    return decision


@flow(name="retraining")
def retraining(workdir: str = ".") -> dict[str, Any]:
    """Version the incoming pairs (``dvc add``), rerun the pipeline (DVC retrains what the new data
    changes), and promote the new model to ``champion`` only if it passes the gate. Any failure
    fails the flow before the gate: nothing is promoted from a failed or partial run.

    ``flows.retrain_mode: finetune`` (with a champion): the pipeline runs as a DVC experiment with
    ``train.init_from`` and ``tokenizer.model_from`` set to the champion's files (see
    ``pipeline.flows.finetune``); a successful experiment leaves them in params.yaml, beside
    dvc.lock. ``scratch`` clears them the same way when they are set."""
    from prefect.runtime import flow_run

    root = Path(workdir).resolve()
    params = params_of(root)
    if params.data.incoming_dir:
        version_task()(str(root), params.data.incoming_dir, params.data.src_lang, params.data.tgt_lang)
    plan = retrain_plan(str(root))
    training_pipeline(workdir=str(root), overrides=plan.overrides(params) or None)
    waiting = pending_challenger(root, paths.AVERAGED_MODEL)
    if waiting:   # registered once the unsent queue is sent: nothing to judge yet, nothing failed
        get_run_logger().warning("%s", waiting)
        create_markdown_artifact(f"# Promotion gate: {NO_CHALLENGER}\n\n{waiting}\n", key=GATE_ARTIFACT,
                                 description="champion/challenger decision: no challenger yet")
        return {"verdict": NO_CHALLENGER, "promoted": False, "reason": waiting, "retrain": plan.summary()}
    decision = promotion_gate(str(root), str(flow_run.get_id() or ""), plan.tags())
    create_markdown_artifact(decision.markdown() + plan.markdown(), key=GATE_ARTIFACT,
                             description=f"champion/challenger decision for {decision.model_name}")
    return {**decision.summary(), "retrain": plan.summary()}
