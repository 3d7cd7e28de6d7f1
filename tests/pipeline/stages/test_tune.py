"""pipeline/stages/tune.py: beam size, alpha and stopping rule chosen on the validation set by the
documented rule; the report, the chosen translations and the MLflow record (params, valid_bleu, the
grid table)."""

from __future__ import annotations

import json

import mlflow
import pytest
import sacrebleu
from mlflow.tracking import MlflowClient

from pipeline.config.params import TuneParams
from pipeline.scoring.literature_bleu import LABEL, bleu_lc_tok
from pipeline.stages.tune import RULE, choose, grid
from pipeline.tracking import links
from transformer.atomic import file_sha256


def test_grid_is_every_point_ascending_and_greedy_once():
    assert grid(TuneParams(beam_sizes=[4, 1], alphas=[1.0, 0.6])) == [
        (1, 0.6, "exact"), (4, 0.6, "exact"), (4, 1.0, "exact")]
    assert grid(TuneParams(beam_sizes=[4], alphas=[0.6, 1.0, 1.5, 2.0, 2.5])) == [
        (4, 0.6, "exact"), (4, 1.0, "exact"), (4, 1.5, "exact"), (4, 2.0, "exact"), (4, 2.5, "exact")]
    # greedy has no stopping rule either: once, with the first listed
    assert grid(TuneParams(beam_sizes=[1, 4], alphas=[1.0], stoppings=["fairseq", "exact"])) == [
        (1, 1.0, "fairseq"), (4, 1.0, "fairseq"), (4, 1.0, "exact")]


def test_a_bad_stopping_rule_in_the_grid_is_named():
    with pytest.raises(ValueError, match=r"tune.stoppings\[1\] must be one of exact, fairseq, got 'soon'"):
        TuneParams(stoppings=["exact", "soon"])


def point(beam_size, alpha, bleu, stopping="exact"):
    return {"beam_size": beam_size, "alpha": alpha, "stopping": stopping, "bleu": bleu}


def test_rule_highest_bleu_then_smaller_beam_then_smaller_alpha_then_the_sooner_stop():
    assert choose([point(4, 0.6, 30.0), point(4, 1.5, 31.2), point(4, 2.0, 31.0)]) == point(4, 1.5, 31.2)
    # ties (to 0.01): the smaller beam, then the smaller alpha, then fairseq's rule (it stops sooner)
    assert choose([point(5, 0.6, 31.2), point(4, 2.0, 31.2), point(4, 1.0, 31.2)]) == point(4, 1.0, 31.2)
    assert choose([point(4, 1.0, 31.204), point(4, 0.6, 31.196)]) == point(4, 0.6, 31.196)
    assert choose([point(4, 1.0, 31.2), point(4, 1.0, 31.2, "fairseq")]) == point(4, 1.0, 31.2, "fairseq")
    assert choose([point(4, 1.0, 31.3), point(4, 1.0, 31.2, "fairseq")]) == point(4, 1.0, 31.3)
    assert "ties" in RULE


def test_report_chosen_translations_and_run_record(workspace):
    report = json.loads((workspace.path / "reports/tune/scores.json").read_text())
    assert report["valid_set"] == "val" and report["sentences"] == 1014 and report["rule"] == RULE
    # the workspace's grid (params.yaml's beam sizes and stopping rules, two alphas), every point scored;
    # no time in the report (a DVC output): decoding times go to MLflow's table below
    assert [(p["beam_size"], p["alpha"], p["stopping"]) for p in report["grid"]] == [
        (4, 0.6, "exact"), (4, 0.6, "fairseq"), (4, 1.0, "exact"), (4, 1.0, "fairseq")]
    assert all(set(p) == {"beam_size", "alpha", "stopping", "bleu", "chrf", "length_ratio"} for p in report["grid"])
    assert "seconds" not in report
    chosen = choose(report["grid"])
    # the literature's BLEU of the chosen point, after the choice: reported, never choosing
    refs_tok = (workspace.path / "data/references/val.de").read_text().splitlines()
    literature = bleu_lc_tok((workspace.path / "reports/tune/val.de").read_text().splitlines(), refs_tok, "de")
    assert report["chosen"] == {**{k: chosen[k] for k in ("beam_size", "alpha", "stopping", "bleu", "chrf",
                                                           "length_ratio")}, "bleu_lc_tok": round(literature.score, 2)}
    assert report["bleu_lc_tok_description"].startswith(LABEL)
    # the DVC metric (`dvc metrics show`): the chosen settings, which evaluate and serving read, and their BLEU
    assert json.loads((workspace.path / "reports/tune.json").read_text()) == {
        "chosen": {k: chosen[k] for k in ("beam_size", "alpha", "stopping")}, "valid_bleu": chosen["bleu"]}
    # the validation translations with the chosen settings, scored as reported
    hyps = (workspace.path / "reports/tune/val.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/val.de").read_text().splitlines()
    assert len(hyps) == len(refs) == 1014
    assert round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2) == chosen["bleu"]
    run = json.loads((workspace.path / "reports/tune/run.json").read_text())
    assert (run["beam_size"], run["alpha"], run["stopping"], run["sentences"]) == (
        chosen["beam_size"], chosen["alpha"], chosen["stopping"], 1014)
    assert "mlflow_run_id" not in run and run["model_sha256"] == file_sha256(workspace.path / "models/model.pt")

    client = MlflowClient(workspace.tracking_uri, workspace.tracking_uri)
    logged = client.get_run(links.find_run(links.LINK_TUNED, run["model_sha256"], "test-experiment", client))
    assert logged.data.params["tune.alphas"] == "[0.6, 1.0]"
    assert logged.data.params["tune.chosen_beam_size"] == str(chosen["beam_size"])
    assert logged.data.params["tune.chosen_alpha"] == str(chosen["alpha"])
    assert logged.data.params["tune.chosen_stopping"] == chosen["stopping"]
    # valid_bleu: tune logs the chosen setting's; evaluate (beam 2 from params here) logs its own after it
    history = [m.value for m in sorted(client.get_metric_history(logged.info.run_id, "valid_bleu"),
                                       key=lambda m: m.timestamp)]
    assert history[0] == chosen["bleu"] and logged.data.metrics["time/tune_seconds"] > 0
    assert logged.data.metrics["tune/valid_bleu_lc_tok"] == report["chosen"]["bleu_lc_tok"]
    mlflow.set_tracking_uri(workspace.tracking_uri)   # load_table searches the runs through the global store
    table = client.load_table(logged.info.experiment_id, "tune/grid.json", run_ids=[logged.info.run_id])
    assert list(table["alpha"]) == pytest.approx([0.6, 0.6, 1.0, 1.0])
    assert list(table["stopping"]) == ["exact", "fairseq", "exact", "fairseq"]
    assert list(table["bleu"]) == pytest.approx([p["bleu"] for p in report["grid"]])
    assert all(seconds > 0 for seconds in table["seconds"])
