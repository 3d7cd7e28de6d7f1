"""The Prefect flows: ``training_pipeline`` (the DVC stages as tasks) and ``retraining`` (incoming
data, scratch or fine-tuning the champion, the pipeline, the champion/challenger gate)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from pipeline import paths, tracking
from pipeline.flows.finetune import FINETUNE, RetrainPlan, plan_retraining
from pipeline.flows.gate import (Decision, GateError, Systems, challenger_version, current_champion,
                                 promote_if_better, translate_with_version)
from pipeline.flows.stages import (RETRIES, STAGES, check_overrides, check_stages, experiment_task, run_dvc,
                                   stage_task, version_task)
from pipeline.io import read_lines
from pipeline.params import Params, load_params

METRICS_ARTIFACT = "training-metrics"
GATE_ARTIFACT = "promotion-gate"


def tracking_uri(root: Path) -> str:
    """The store the stages of ``root`` log into: ``MLFLOW_TRACKING_URI``, else ``root/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / tracking.DEFAULT_DB}"


def params_of(root: Path) -> Params:
    return load_params(root / os.environ.get("PARAMS_FILE", "params.yaml"))


def read_metrics(root: Path) -> dict[str, dict[str, Any]]:
    file = root / paths.METRICS
    if not file.is_file():
        raise GateError(f"{file} does not exist: the evaluate stage did not finish")
    return json.loads(file.read_text())


def model_run_id(root: Path) -> str:
    """The MLflow run that ``models/model.pt`` names (the average stage writes it)."""
    from transformer.checkpoint import load_checkpoint

    run_id = load_checkpoint(root / paths.AVERAGED_MODEL).get("callbacks", {}).get(tracking.RUN_ID_KEY)
    if not run_id:
        raise GateError(f"{paths.AVERAGED_MODEL} names no MLflow run: nothing to register or promote")
    return run_id


def metrics_markdown(metrics: dict[str, dict[str, Any]], run_id: str | None) -> str:
    lines = ["# Training pipeline: test scores", "",
             "| test set | BLEU | chrF | sentences | decode s |", "|---|---:|---:|---:|---:|"]
    for test_set, m in metrics.items():
        lines.append(f"| {test_set} | {m.get('bleu', '')} | {m.get('chrf', '')} | {m.get('sentences', '')} | "
                     f"{m.get('decode_seconds', '')} |")
    signatures = sorted({m["signature"] for m in metrics.values() if "signature" in m})
    lines += ["", *(f"BLEU signature: `{s}`" for s in signatures)]
    if run_id:
        lines += ["", f"MLflow run: `{run_id}`"]
    return "\n".join(lines) + "\n"


@flow(name="training-pipeline")
def training_pipeline(workdir: str = ".", overrides: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the DVC pipeline in ``workdir``: each stage a task (``dvc repro --single-item``) in the
    DAG's order, or one ``dvc exp run -S key=value ...`` task when ``overrides`` are given.
    Returns ``reports/metrics.json`` and publishes it as the ``training-metrics`` artifact."""
    root = Path(workdir).resolve()
    check_stages(root)
    if overrides:
        check_overrides(overrides)
        experiment_task()(list(overrides), str(root))
    else:
        for stage in STAGES:
            stage_task(stage)(stage, str(root))
    metrics = read_metrics(root)
    try:
        run_id: str | None = model_run_id(root)
    except Exception:  # noqa: BLE001 (the artifact only mentions it)
        run_id = None
    create_markdown_artifact(metrics_markdown(metrics, run_id), key=METRICS_ARTIFACT,
                             description=f"reports/metrics.json of the pipeline in {root}")
    get_run_logger().info("metrics: %s", json.dumps({k: {"bleu": v.get("bleu"), "chrf": v.get("chrf")}
                                                     for k, v in metrics.items()}))
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


@task(name="promotion gate", cache_policy=NO_CACHE)
def promotion_gate(workdir: str, flow_run_id: str = "", extra_tags: dict[str, str] | None = None) -> Decision:
    """Challenger (the model the pipeline just registered) against the registry's champion."""
    logger = get_run_logger()
    root = Path(workdir)
    params = params_of(root)
    data, flows = params.data, params.flows
    name = params.tracking.registered_model
    uri = tracking_uri(root)
    client = MlflowClient(uri, uri)

    metrics = read_metrics(root)
    missing = [t for t in data.test_sets if t not in metrics]
    if missing:
        raise GateError(f"{paths.METRICS} has no scores for {', '.join(missing)}: the evaluation is partial")
    challenger = challenger_version(client, name, model_run_id(root))
    logged = client.get_run(challenger.run_id).data.metrics
    for test_set in data.test_sets:
        key = f"test/{test_set}/bleu"
        if key not in logged or abs(logged[key] - float(metrics[test_set]["bleu"])) > 0.01:
            raise GateError(f"{name} version {challenger.version} (run {challenger.run_id}) logged {key}="
                            f"{logged.get(key)} but {paths.METRICS} says {metrics[test_set]['bleu']}: "
                            "the registry and the workspace disagree")
    champion = current_champion(client, name)
    systems = None
    if champion is not None and str(champion.version) != str(challenger.version):
        sources = {t: read_lines(root / paths.corpus_file(t, data.src_lang)) for t in data.test_sets}
        logger.info("translating %s with the champion, %s version %s", ", ".join(data.test_sets), name,
                    champion.version)
        e = params.evaluate
        champion_hyps = translate_with_version(client, name, str(champion.version), sources, e.beam_size, e.alpha,
                                               e.max_len_b, e.batch_sentences, getattr(e, "precision", "fp32"),
                                               tracking_uri=uri)
        systems = {t: Systems(read_lines(root / paths.corpus_file(t, data.tgt_lang)), champion_hyps[t],
                              read_lines(root / paths.TRANSLATIONS_DIR / f"{t}.{data.tgt_lang}"))
                   for t in data.test_sets}
    decision = promote_if_better(client, name, challenger, champion, systems, primary=data.test_sets[0],
                                 guarded=flows.guarded_test_sets, significance=flows.significance,
                                 resamples=flows.bootstrap_resamples,
                                 extra_tags={**(extra_tags or {}),
                                             **({"gate.prefect_flow_run_id": flow_run_id} if flow_run_id else {})})
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
    decision = promotion_gate(str(root), str(flow_run.get_id() or ""), plan.tags())
    create_markdown_artifact(decision.markdown() + plan.markdown(), key=GATE_ARTIFACT,
                             description=f"champion/challenger decision for {decision.model_name}")
    return {**decision.summary(), "retrain": plan.summary()}
