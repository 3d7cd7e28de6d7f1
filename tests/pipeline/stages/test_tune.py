"""pipeline/stages/tune.py: the engine, its beam size, alpha and stopping rule, and CTranslate2's compute
type chosen on the validation set by the documented rules; each engine's grid; torch only, in one line,
where CTranslate2 cannot decode; the report, the chosen translations and the MLflow record (params,
valid_bleu, each engine's, the grid table)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import mlflow
import pytest
import sacrebleu
from mlflow.tracking import MlflowClient

from pipeline.config.params import TuneParams
from pipeline.scoring.literature_bleu import LABEL, bleu_lc_tok
from pipeline.stages.tune import RULE, choose, choose_compute_type, choose_engine, grid, tune
from pipeline.tracking import links
from transformer.atomic import file_sha256

from ..conftest import TINY
from .conftest import SENTENCES, SMALL

pytestmark = pytest.mark.fast

TUNED = ("beam_size", "alpha", "stopping", "engine", "compute_type")
POINT = {*TUNED, "bleu", "chrf", "length_ratio"}   # a grid point: settings and scores, never a time
TUNED_SENTENCES = TINY["tune"]["max_sentences"]   # the session workspace's tune decodes the first 200


def test_grid_is_every_point_ascending_and_greedy_once():
    assert grid(TuneParams(beam_sizes=[4, 1], alphas=[1.0, 0.6])) == [
        (1, 0.6, "exact"), (4, 0.6, "exact"), (4, 1.0, "exact")]
    assert grid(TuneParams(beam_sizes=[4], alphas=[0.6, 1.0, 1.5, 2.0, 2.5])) == [
        (4, 0.6, "exact"), (4, 1.0, "exact"), (4, 1.5, "exact"), (4, 2.0, "exact"), (4, 2.5, "exact")]
    # greedy has no stopping rule either: once, with the first listed
    assert grid(TuneParams(beam_sizes=[1, 4], alphas=[1.0], stoppings=["fairseq", "exact"])) == [
        (1, 1.0, "fairseq"), (4, 1.0, "fairseq"), (4, 1.0, "exact")]


def test_ctranslate2_has_its_own_alphas_and_only_its_own_stopping_rule():
    t = TuneParams(beam_sizes=[4, 1], alphas=[0.6, 1.5], stoppings=["exact", "fairseq"], ct2_alphas=[1.2, 0.8])
    assert grid(t, "ctranslate2") == [(1, 0.8, "fairseq"), (4, 0.8, "fairseq"), (4, 1.2, "fairseq")]
    assert grid(t, "torch") == grid(t) == [(1, 0.6, "exact"), (4, 0.6, "exact"), (4, 0.6, "fairseq"),
                                           (4, 1.5, "exact"), (4, 1.5, "fairseq")]
    assert TuneParams().engines == ["torch", "ctranslate2"]
    assert TuneParams().ct2_alphas == [0.6, 0.8, 1.0, 1.2, 1.4]   # |Y| ** alpha: fairseq's lenpen range


def test_the_compute_type_is_int8_within_0_2_of_float32_else_float32():
    assert choose_compute_type({"float32": 39.40, "int8": 39.20}) == "int8"    # 0.2 less: within
    assert choose_compute_type({"float32": 39.40, "int8": 39.19}) == "float32"
    assert choose_compute_type({"float32": 39.40, "int8": 39.61}) == "int8"    # better is within too
    assert choose_compute_type({"float32": 39.40}) == "float32"                # int8 could not load


def test_the_engine_is_ctranslate2_within_0_3_of_torch_else_torch():
    assert choose_engine({"torch": 39.37, "ctranslate2": 39.07}) == "ctranslate2"   # 0.3 less: within
    assert choose_engine({"torch": 39.37, "ctranslate2": 39.06}) == "torch"
    assert choose_engine({"ctranslate2": 39.39, "torch": 39.37}) == "ctranslate2"
    assert choose_engine({"torch": 39.37}) == "torch"
    assert choose_engine({"ctranslate2": 12.0}) == "ctranslate2"   # no torch searched: nothing to hold it to


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
    assert report["valid_set"] == "val" and report["sentences"] == TUNED_SENTENCES and report["rule"] == RULE
    # the workspace's grids (params.yaml's beam sizes; torch: both stopping rules, two alphas; CTranslate2: its
    # own two alphas and rule, then int8 at its point), every point scored; no time in the report (a DVC
    # output): decoding times go to MLflow's table below
    torch_points = [p for p in report["grid"] if p["engine"] == "torch"]
    ct2_points = [p for p in report["grid"] if p["engine"] == "ctranslate2"]
    assert [(p["beam_size"], p["alpha"], p["stopping"]) for p in torch_points] == [
        (4, 0.6, "exact"), (4, 0.6, "fairseq"), (4, 1.0, "exact"), (4, 1.0, "fairseq")]
    assert [(p["compute_type"], p["beam_size"], p["alpha"], p["stopping"]) for p in ct2_points[:2]] == [
        ("float32", 4, 0.6, "fairseq"), ("float32", 4, 1.2, "fairseq")]
    assert len(ct2_points) == 3 and ct2_points[2]["compute_type"] == "int8"
    assert all(set(p) == POINT for p in report["grid"]) and "seconds" not in report
    chosen = report["engines"][report["chosen"]["engine"]]["chosen"]
    assert report["engines"]["torch"]["chosen"] == choose(torch_points)
    # the literature's BLEU of the chosen point, after the choice: reported, never choosing
    refs_tok = (workspace.path / "data/references/val.de").read_text().splitlines()[:TUNED_SENTENCES]
    literature = bleu_lc_tok((workspace.path / "reports/tune/val.de").read_text().splitlines(), refs_tok, "de")
    assert report["chosen"] == {**chosen, "bleu_lc_tok": round(literature.score, 2)}
    assert report["bleu_lc_tok_description"].startswith(LABEL)
    # the DVC metric (`dvc metrics show`): the chosen settings, which evaluate and serving read, and their BLEU
    assert json.loads((workspace.path / "reports/tune.json").read_text()) == {
        "chosen": {k: chosen[k] for k in TUNED}, "valid_bleu": chosen["bleu"]}
    # the validation translations with the chosen settings, scored as reported
    hyps = (workspace.path / "reports/tune/val.de").read_text().splitlines()
    refs = (workspace.path / "data/corpus/val.de").read_text().splitlines()[:TUNED_SENTENCES]
    assert len(hyps) == len(refs) == TUNED_SENTENCES
    assert round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2) == chosen["bleu"]
    run = json.loads((workspace.path / "reports/tune/run.json").read_text())
    assert {k: run[k] for k in (*TUNED, "sentences")} == {**{k: chosen[k] for k in TUNED}, "sentences": TUNED_SENTENCES}
    assert "mlflow_run_id" not in run and run["model_sha256"] == file_sha256(workspace.path / "models/model.pt")
    # at run time, both engines' val BLEU and the choice (issue #36: within 0.3 of torch's)
    out = workspace.first_run.stdout
    both = next(line for line in out.splitlines() if line.startswith("val BLEU of each engine's choice: torch ("))
    assert "; ctranslate2 " in both and f"chosen: {chosen['engine']} " in out

    client = MlflowClient(workspace.tracking_uri, workspace.tracking_uri)
    logged = client.get_run(links.find_run(links.LINK_TUNED, run["model_sha256"], "test-experiment", client))
    assert logged.data.params["tune.alphas"] == "[0.6, 1.0]"
    assert logged.data.params["tune.engines"] == '["torch", "ctranslate2"]'
    for key in TUNED:
        assert logged.data.params[f"tune.chosen_{key}"] == str(chosen[key])
    # valid_bleu: tune logs the chosen setting's; evaluate (beam 2 from params here) logs its own after it
    history = [m.value for m in sorted(client.get_metric_history(logged.info.run_id, "valid_bleu"),
                                       key=lambda m: m.timestamp)]
    assert history[0] == chosen["bleu"] and logged.data.metrics["time/tune_seconds"] > 0
    assert logged.data.metrics["tune/valid_bleu_lc_tok"] == report["chosen"]["bleu_lc_tok"]
    for engine, searched in report["engines"].items():   # each engine's own choice
        assert logged.data.metrics[f"tune/valid_bleu/{engine}"] == searched["chosen"]["bleu"]
    mlflow.set_tracking_uri(workspace.tracking_uri)   # load_table searches the runs through the global store
    table = client.load_table(logged.info.experiment_id, "tune/grid.json", run_ids=[logged.info.run_id])
    assert list(table["engine"]) == [p["engine"] for p in report["grid"]]
    assert list(table["alpha"]) == pytest.approx([p["alpha"] for p in report["grid"]])
    assert list(table["stopping"]) == [p["stopping"] for p in report["grid"]]
    assert list(table["bleu"]) == pytest.approx([p["bleu"] for p in report["grid"]])
    assert all(seconds > 0 for seconds in table["seconds"])


# ----------------------------------------------------------------------------- the stage on a small workspace

def read_json(path: str) -> dict:
    return json.loads(Path(path).read_text())


def settings(points: list[dict]) -> list[tuple]:
    return [(p["beam_size"], p["alpha"], p["stopping"]) for p in points]


def test_each_engine_on_its_grid_then_the_compute_type_then_the_engine(decoding_workspace, capsys):
    report = tune(decoding_workspace())
    out = capsys.readouterr().out
    assert all(set(p) == POINT for p in report["grid"])   # no time: a DVC output
    torch_points = [p for p in report["grid"] if p["engine"] == "torch"]
    float32 = [p for p in report["grid"] if p["engine"] == "ctranslate2" and p["compute_type"] == "float32"]
    int8 = [p for p in report["grid"] if p["engine"] == "ctranslate2" and p["compute_type"] == "int8"]
    assert len(report["grid"]) == len(torch_points) + len(float32) + len(int8)
    assert settings(torch_points) == grid(TuneParams(**SMALL["tune"]))
    assert all(p["compute_type"] is None for p in torch_points)
    assert settings(float32) == grid(TuneParams(**SMALL["tune"]), "ctranslate2") == [
        (1, 0.6, "fairseq"), (2, 0.6, "fairseq"), (2, 1.0, "fairseq")]
    # int8 decodes once, at the point chosen in float32; then the rules, in their order
    ct2_best = choose(float32)
    assert settings(int8) == settings([ct2_best])
    compute_type = choose_compute_type({"float32": ct2_best["bleu"], "int8": int8[0]["bleu"]})
    per_engine = {"torch": choose(torch_points), "ctranslate2": ct2_best if compute_type == "float32" else int8[0]}
    assert report["engines"] == {name: {"chosen": p} for name, p in per_engine.items()}
    chosen = per_engine[choose_engine({name: p["bleu"] for name, p in per_engine.items()})]
    assert report["chosen"] == chosen and report["skipped"] == {} and report["rule"] == RULE
    # what evaluate reads, and the translations it may reuse, with the engine and compute type they came from
    assert read_json("reports/tune.json") == {"chosen": {k: chosen[k] for k in TUNED}, "valid_bleu": chosen["bleu"]}
    run = read_json("reports/tune/run.json")
    assert {k: run[k] for k in (*TUNED, "sentences")} == {**{k: chosen[k] for k in TUNED}, "sentences": SENTENCES}
    hyps = Path("reports/tune/val.de").read_text().splitlines()
    refs = Path("data/corpus/val.de").read_text().splitlines()
    assert round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2) == chosen["bleu"]
    # both engines' val BLEU on the console, and the choice with its rule
    both = next(line for line in out.splitlines() if line.startswith("val BLEU of each engine's choice: "))
    assert both.endswith(f"torch (beam {per_engine['torch']['beam_size']}, alpha {per_engine['torch']['alpha']:g}, "
                         f"stopping {per_engine['torch']['stopping']}) {per_engine['torch']['bleu']:.2f}; "
                         f"ctranslate2 {compute_type} (beam {ct2_best['beam_size']}, alpha {ct2_best['alpha']:g}, "
                         f"stopping fairseq) {per_engine['ctranslate2']['bleu']:.2f}"), both
    assert f"ctranslate2's compute type: {compute_type} (BLEU float32 {ct2_best['bleu']:.2f}, int8 " in out
    assert f"chosen: {chosen['engine']} " in out and "within 0.3 of torch's" in out


@pytest.mark.parametrize("why", ["no export", "not installed"])
def test_torch_only_in_one_line_where_ctranslate2_cannot_decode(why, decoding_workspace, capsys, monkeypatch):
    params = decoding_workspace(tune={"beam_sizes": [1]})
    if why == "no export":
        shutil.rmtree("models/ctranslate2")
        expected = "tune: CTranslate2 has no exported model in models/ctranslate2 (python -m pipeline.stages.export)"
    else:
        monkeypatch.setitem(sys.modules, "ctranslate2", None)   # import ctranslate2 fails, as where it is missing
        expected = "tune: CTranslate2 is not installed ("
    report = tune(params)
    out, err = capsys.readouterr()
    said = [line for line in (out + err).splitlines() if "CTranslate2" in line]
    assert len(said) == 1 and said[0].startswith(expected) and said[0].endswith(": searching torch only"), said
    assert list(report["engines"]) == ["torch"] and list(report["skipped"]) == ["ctranslate2"]
    assert {p["engine"] for p in report["grid"]} == {"torch"}
    assert read_json("reports/tune.json")["chosen"] == {"beam_size": 1, "alpha": 1.0, "stopping": "exact",
                                                        "engine": "torch", "compute_type": None}


def test_without_torch_in_the_engines_ctranslate2_is_chosen_and_the_check_skipped(decoding_workspace, capsys):
    params = decoding_workspace(tune={"engines": ["ctranslate2"], "beam_sizes": [1]})
    report = tune(params)
    out = capsys.readouterr().out
    assert list(report["engines"]) == ["ctranslate2"] and report["chosen"]["engine"] == "ctranslate2"
    assert {p["engine"] for p in report["grid"]} == {"ctranslate2"}
    assert "tune.engines lists no torch: the check against torch's BLEU is skipped" in out
    # where it cannot decode either: torch, what every caller falls back to, rather than no choice at all
    shutil.rmtree("models/ctranslate2")
    assert tune(params)["chosen"]["engine"] == "torch"
    assert "searching torch only" in capsys.readouterr().out
