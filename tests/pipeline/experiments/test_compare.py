"""pipeline/experiments/compare.py: runs ranked by validation BLEU (test scores shown, never ranking), naming the
params that differ between them."""

import math
import subprocess
import sys

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from pipeline.experiments import compare

pytestmark = pytest.mark.fast


def markdown_rows(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("|")]
    return [c.strip() for c in lines[0]], [[c.strip() for c in line] for line in lines[2:]]


def test_compare_ranks_two_runs_and_names_the_differing_param(workspace, beam1_experiment):
    result = workspace.run(sys.executable, "-m", "pipeline.experiments.compare")
    assert result.returncode == 0, result.stderr
    assert "evaluate.beam_size" in result.stdout.split("Params that differ between runs: ")[1].splitlines()[0]
    assert "The column `valid_bleu (ranks)` ranks. Test scores are shown, never used to rank." in result.stdout
    header, rows = markdown_rows((workspace.path / "reports/compare.md").read_text())
    assert len(rows) == 2
    assert "test BLEU test_2016_flickr" in header and "test chrF test_2016_flickr" in header
    ranked = [float(row[header.index("valid_bleu (ranks)")]) for row in rows]
    ranked = [-math.inf if math.isnan(v) else v for v in ranked]   # runs without it come last
    assert ranked == sorted(ranked, reverse=True)
    assert {row[header.index("evaluate.beam_size")] for row in rows} == {"1", "2"}
    assert (workspace.path / "reports/compare_valid.png").is_file()


@pytest.fixture
def store(tmp_path, monkeypatch) -> MlflowClient:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri)


def log_run(c: MlflowClient, experiment_id: str, name: str, metrics: dict[str, float], lr: str) -> None:
    run = c.create_run(experiment_id, run_name=name)
    for key, value in metrics.items():
        c.log_metric(run.info.run_id, key, value)
    c.log_param(run.info.run_id, "train.lr_scale", lr)
    c.set_terminated(run.info.run_id)


def test_validation_bleu_ranks_and_test_bleu_never_does(store):
    exp = store.create_experiment("ranking")
    # Test BLEU in the opposite order of validation BLEU; the best test score has no validation score.
    log_run(store, exp, "best-on-valid", {"valid_bleu": 30.0, "test/t1/bleu": 10.0, "test/t1/chrf": 40.0}, "0.4")
    log_run(store, exp, "no-valid", {"test/t1/bleu": 50.0, "test/t1/chrf": 70.0}, "0.5")
    log_run(store, exp, "second-on-valid", {"valid_bleu": 20.0, "test/t1/bleu": 40.0, "test/t1/chrf": 60.0}, "0.6")
    table, differing = compare.runs_table("ranking", test_sets=["t1"])
    assert table["name"].tolist() == ["best-on-valid", "second-on-valid", "no-valid"]
    assert table["valid_bleu (ranks)"].tolist()[:2] == [30.0, 20.0] and math.isnan(table["valid_bleu (ranks)"][2])
    assert table["test BLEU t1"].tolist() == [10.0, 40.0, 50.0]
    assert table["test chrF t1"].tolist() == [40.0, 60.0, 70.0]
    assert differing == ["train.lr_scale"]


def test_a_test_metric_is_refused_as_the_ranking(store):
    with pytest.raises(ValueError, match="test sets are reported, never used to rank"):
        compare.runs_table("ranking", "test/t1/bleu")


def test_run_ids_and_names_that_look_like_numbers_print_verbatim():
    # MLflow's run ids are hex: "02608e68" is also a float to tabulate (2.608e+71), "00012345" an int.
    table = pd.DataFrame({"run": ["02608e68", "00012345"], "name": ["1e5", "007"], "status": ["FINISHED"] * 2,
                          "valid_bleu (ranks)": [12.5, float("nan")], "train.lr_scale": ["0.6", "1.0"]})
    header, rows = markdown_rows(compare.markdown_table(table))
    assert [row[:3] for row in rows] == [["02608e68", "1e5", "FINISHED"], ["00012345", "007", "FINISHED"]]
    assert [row[header.index("valid_bleu (ranks)")] for row in rows] == ["12.5", "nan"]
    assert [row[header.index("train.lr_scale")] for row in rows] == ["0.6", "1"]


def test_the_literatures_bleu_is_a_column_never_the_ranking(store):
    """Runs that logged bleu_lc_tok (Multi30k) show it for the validation and test sets; the ranking stays
    valid_bleu's even where the literature's measure orders the runs the other way."""
    exp = store.create_experiment("literature")
    log_run(store, exp, "a", {"valid_bleu": 30.0, "dev/val/bleu_lc_tok": 20.0, "test/t1/bleu": 10.0,
                              "test/t1/bleu_lc_tok": 11.0}, "0.4")
    log_run(store, exp, "b", {"valid_bleu": 25.0, "dev/val/bleu_lc_tok": 40.0, "test/t1/bleu": 12.0,
                              "test/t1/bleu_lc_tok": 33.0}, "0.5")
    log_run(store, exp, "wmt", {"valid_bleu": 10.0, "test/t1/bleu": 5.0}, "0.6")   # no literature measure
    table, _ = compare.runs_table("literature", test_sets=["t1"])
    assert table["name"].tolist() == ["a", "b", "wmt"]
    assert table["val BLEU lc.tok val"].tolist()[:2] == [20.0, 40.0] and math.isnan(table["val BLEU lc.tok val"][2])
    assert table["test BLEU lc.tok t1"].tolist()[:2] == [11.0, 33.0]
    with pytest.raises(ValueError, match="never used to rank"):
        compare.runs_table("literature", "test/t1/bleu_lc_tok")
    log_run(store, store.create_experiment("wmt14"), "wmt", {"valid_bleu": 10.0, "test/t1/bleu": 5.0}, "0.6")
    plain, _ = compare.runs_table("wmt14", test_sets=["t1"])
    assert not [c for c in plain.columns if "lc.tok" in c]


def log_form_run(c: MlflowClient, experiment_id: str, name: str, metrics: dict[str, float],
                 form: str | None) -> None:
    run = c.create_run(experiment_id, run_name=name)
    for key, value in metrics.items():
        c.log_metric(run.info.run_id, key, value)
    if form is not None:   # runs from before the key have no text form param: raw
        c.log_param(run.info.run_id, compare.TEXT_FORM_PARAM, form)
    c.set_terminated(run.info.run_id)


def test_runs_of_two_text_forms_are_ranked_by_the_validation_bleu_lc_tok_each_logged(store):
    """valid_bleu is sacreBLEU for a raw run and bleu_lc_tok for a run of the literature's text: across
    forms the validation bleu_lc_tok ranks; within one form valid_bleu still does."""
    exp = store.create_experiment("forms")
    # The raw run's sacreBLEU (cased) is above the other's bleu_lc_tok; in bleu_lc_tok it is below.
    log_form_run(store, exp, "raw", {"valid_bleu": 41.6, "dev/val/bleu_lc_tok": 41.2}, "raw")
    log_form_run(store, exp, "lc", {"valid_bleu": 41.5, "dev/val/bleu_lc_tok": 41.5}, "lc_norm_tok")
    log_form_run(store, exp, "old-raw", {"valid_bleu": 42.0}, None)   # no bleu_lc_tok logged: last
    table, differing = compare.runs_table("forms")
    assert table["name"].tolist() == ["lc", "raw", "old-raw"]
    assert table["dev/val/bleu_lc_tok (ranks)"].tolist()[:2] == [41.5, 41.2]
    assert "valid_bleu (ranks)" not in table.columns and compare.TEXT_FORM_PARAM in differing
    same = store.create_experiment("one-form")
    log_form_run(store, same, "a", {"valid_bleu": 30.0, "dev/val/bleu_lc_tok": 20.0}, "raw")
    log_form_run(store, same, "b", {"valid_bleu": 25.0, "dev/val/bleu_lc_tok": 40.0}, None)
    table, _ = compare.runs_table("one-form")
    assert table["name"].tolist() == ["a", "b"] and "valid_bleu (ranks)" in table.columns
    explicit, _ = compare.runs_table("forms", "valid_bleu_other")   # a metric asked for by name ranks as asked
    assert "valid_bleu_other (ranks)" in explicit.columns
    two_sets = store.create_experiment("two-sets")
    log_form_run(store, two_sets, "raw", {"valid_bleu": 41.6, "dev/val/bleu_lc_tok": 41.2}, "raw")
    log_form_run(store, two_sets, "lc", {"valid_bleu": 41.5, "dev/val2/bleu_lc_tok": 41.5}, "lc_norm_tok")
    with pytest.raises(ValueError, match="pass --metric dev/<set>/bleu_lc_tok"):
        compare.runs_table("two-sets")


@pytest.mark.slow
def test_the_command_says_why_runs_of_two_text_forms_are_ranked_by_bleu_lc_tok(store, tmp_path):
    exp = store.create_experiment("forms-cli")
    log_form_run(store, exp, "raw", {"valid_bleu": 41.6, "dev/val/bleu_lc_tok": 41.2}, "raw")
    log_form_run(store, exp, "lc", {"valid_bleu": 41.5, "dev/val/bleu_lc_tok": 41.5}, "lc_norm_tok")
    result = subprocess.run([sys.executable, "-m", "pipeline.experiments.compare", "--experiment", "forms-cli"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ranked by dev/val/bleu_lc_tok (validation)" in result.stdout
    assert ("The runs trained on text forms lc_norm_tok, raw (`tokenizer.text_form`): valid_bleu is sacreBLEU for "
            "raw text and bleu_lc_tok for the literature's") in result.stdout
    header, rows = markdown_rows((tmp_path / "reports/compare.md").read_text())
    assert [row[header.index("name")] for row in rows] == ["lc", "raw"]
    lc = store.create_experiment("forms-two-sets")
    log_form_run(store, lc, "raw", {"valid_bleu": 41.6, "dev/val/bleu_lc_tok": 41.2}, "raw")
    log_form_run(store, lc, "lc", {"valid_bleu": 41.5, "dev/val2/bleu_lc_tok": 41.5}, None)
    log_form_run(store, lc, "lc2", {"valid_bleu": 41.5}, "lc_norm_tok")
    refused = subprocess.run([sys.executable, "-m", "pipeline.experiments.compare", "--experiment", "forms-two-sets"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert refused.stderr.startswith("error: the runs trained on text forms lc_norm_tok, raw")
    assert refused.stderr.count("\n") == 1
