"""dvc.yaml: a second repro is a no-op; an evaluate param reruns only evaluate; a tune param reruns
tune and evaluate; metrics and plots work; evaluate records the decoding settings it used."""

from __future__ import annotations

import json
import shutil
import subprocess

import yaml

from .conftest import BIN


def test_second_repro_is_a_no_op(workspace):
    out = workspace.second_repro.stdout
    assert workspace.second_repro.returncode == 0
    assert "Running stage" not in out
    assert "Data and pipelines are up to date" in out


def test_tune_runs_between_average_and_evaluate(workspace):
    ran = [line for line in workspace.first_run.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == [f"Running stage '{s}':" for s in ("download", "tokenizer", "train", "average", "tune", "evaluate")]
    assert "decoding: beam 2 (params), alpha " in workspace.first_run.stdout
    assert "(tune)" in workspace.first_run.stdout


def test_evaluate_param_reruns_only_evaluate(beam1_experiment):
    ran = [line for line in beam1_experiment.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'evaluate':"]


def test_metrics_and_plots_commands(workspace, beam1_experiment):
    show = workspace.dvc("metrics", "show")
    assert show.returncode == 0 and "test_2016_flickr.bleu" in show.stdout
    assert "chosen.alpha" in show.stdout and "decoding.alpha_from" in show.stdout
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    assert (metrics["decoding"]["beam_size"], metrics["decoding"]["beam_size_from"]) == (1, "params")
    diff = workspace.dvc("metrics", "diff")
    assert diff.returncode == 0
    plots = workspace.dvc("plots", "show", "-o", "plots_html")
    assert plots.returncode == 0, plots.stderr
    assert (workspace.path / "plots_html" / "index.html").is_file()


def test_tune_params_rerun_tune_and_evaluate_and_explicit_settings_win(workspace, tmp_path):
    """In a copy of the workspace (no MLflow store: tracking is skipped with a warning): a new grid
    reruns tune, then evaluate with its choice; evaluate.beam_size and evaluate.alpha set rerun
    evaluate alone, which records them as coming from params."""
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "plots_html"))
    env = {**workspace.env, "PYTHONPATH": str(copy), "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}

    def repro(**sections) -> list[str]:
        params = yaml.safe_load((copy / "params.yaml").read_text())
        for section, values in sections.items():
            params[section].update(values)
        (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        done = subprocess.run([str(BIN / "dvc"), "repro"], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return [line for line in done.stdout.splitlines() if line.startswith("Running stage")]

    assert repro(evaluate={"beam_size": None}, tune={"beam_sizes": [1, 2], "alphas": [1.0, 0.6],
                                                    "max_sentences": 200}) == [
        "Running stage 'tune':", "Running stage 'evaluate':"]
    report = json.loads((copy / "reports/tune.json").read_text())
    assert [(p["beam_size"], p["alpha"]) for p in report["grid"]] == [(1, 0.6), (2, 0.6), (2, 1.0)]
    assert report["sentences"] == 200
    metrics = json.loads((copy / "reports/metrics.json").read_text())
    chosen = report["chosen"]
    assert {k: metrics["decoding"][k] for k in ("beam_size", "alpha", "beam_size_from", "alpha_from")} == {
        "beam_size": chosen["beam_size"], "alpha": chosen["alpha"], "beam_size_from": "tune", "alpha_from": "tune"}
    # tune decoded 200 of the 1014 validation sentences: evaluate decodes the whole set itself
    assert metrics["dev"]["val"]["sentences"] == 1014 and metrics["dev"]["val"]["translated_by"] == "evaluate"

    assert repro(evaluate={"beam_size": 3, "alpha": 0.8}) == ["Running stage 'evaluate':"]
    metrics = json.loads((copy / "reports/metrics.json").read_text())
    assert {k: metrics["decoding"][k] for k in ("beam_size", "alpha", "beam_size_from", "alpha_from")} == {
        "beam_size": 3, "alpha": 0.8, "beam_size_from": "params", "alpha_from": "params"}
