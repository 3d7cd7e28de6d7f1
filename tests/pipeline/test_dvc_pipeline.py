"""dvc.yaml: a second repro is a no-op; an evaluate param reruns only evaluate; a tune param reruns
tune and evaluate; metrics and plots work; evaluate records the decoding settings it used."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from .conftest import BIN

pytestmark = pytest.mark.fast


def test_second_repro_is_a_no_op(workspace):
    out = workspace.second_repro.stdout
    assert workspace.second_repro.returncode == 0
    assert "Running stage" not in out
    assert "Data and pipelines are up to date" in out


def test_tune_runs_between_average_and_evaluate(workspace):
    ran = [line for line in workspace.first_run.stdout.splitlines() if line.startswith("Running stage")]
    names = [line.split("'")[1] for line in ran]
    chain = ["download", "tokenizer", "train", "average", "tune", "evaluate"]
    assert [s for s in names if s in chain] == chain, names
    assert "average" in names[:names.index("export")], names   # the CTranslate2 model of the averaged one
    assert "decoding: beam 2 (params), alpha " in workspace.first_run.stdout
    assert "(tune)" in workspace.first_run.stdout


def test_evaluate_param_reruns_only_evaluate(beam1_experiment):
    ran = [line for line in beam1_experiment.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["Running stage 'evaluate':"]


def test_metrics_and_plots_commands(workspace, beam1_experiment):
    show = workspace.dvc("metrics", "show")
    assert show.returncode == 0 and "test.test_2016_flickr.bleu" in show.stdout
    assert "chosen.alpha" in show.stdout and "decoding.alpha" in show.stdout and "valid_ppl" in show.stdout
    # a few headline columns (docs/metrics.md); signatures, the grid and each setting's source are detail.
    # 24: Path, 4 of train, 6 of tune, per set (a test set and val) BLEU, chrF and the literature's BLEU, the test
    # set's two 95% intervals, 5 settings
    header = show.stdout.splitlines()[0].split()
    assert "test.test_2016_flickr.bleu_lc_tok" in show.stdout and "decoding.engine" in show.stdout
    assert "test.test_2016_flickr.bleu_ci95" in header and "test.test_2016_flickr.bleu_lc_tok_ci95" in header
    assert len(header) <= 24 and not any(k in show.stdout for k in ("signature", "_from", "rule", "grid")), header
    metrics = json.loads((workspace.path / "reports/metrics.json").read_text())
    detail = json.loads((workspace.path / "reports/evaluate/scores.json").read_text())
    assert metrics["decoding"]["beam_size"] == 1 and detail["decoding"]["beam_size_from"] == "params"
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
    report = json.loads((copy / "reports/tune/scores.json").read_text())
    assert [(p["beam_size"], p["alpha"], p["stopping"]) for p in report["grid"] if p["engine"] == "torch"] == [
        (1, 0.6, "exact"), (2, 0.6, "exact"), (2, 0.6, "fairseq"), (2, 1.0, "exact"), (2, 1.0, "fairseq")]
    assert report["sentences"] == 200
    metrics = json.loads((copy / "reports/evaluate/scores.json").read_text())
    chosen = json.loads((copy / "reports/tune.json").read_text())["chosen"]
    assert metrics["decoding"] == {**chosen, **{f"{k}_from": "tune" for k in chosen}, "max_len_b": 8,
                                   "precision": "fp32"}
    # tune decoded 200 of the 1014 validation sentences: evaluate decodes the whole set itself
    assert metrics["dev"]["val"]["sentences"] == 1014 and metrics["dev"]["val"]["translated_by"] == "evaluate"

    assert repro(evaluate={"beam_size": 3, "alpha": 0.8}) == ["Running stage 'evaluate':"]
    metrics = json.loads((copy / "reports/evaluate/scores.json").read_text())
    assert {k: metrics["decoding"][k] for k in ("beam_size", "alpha", "beam_size_from", "alpha_from")} == {
        "beam_size": 3, "alpha": 0.8, "beam_size_from": "params", "alpha_from": "params"}


def test_a_fresh_run_of_the_same_commit_gives_the_same_lock_file(workspace, tmp_path):
    """DVC's promise: a stage's outputs follow from its deps and params. A second workspace made
    from the same code and params, run from scratch as the README says a user types it (the venv
    entered with ``source .venv/bin/activate``, then plain ``dvc repro``), writes a dvc.lock
    identical to the first run's, hash for hash: every output, from the corpus to the model, the
    curves, the metrics, the translations and the attention plots."""
    import os

    from .conftest import make_workspace, session_params

    path, env = make_workspace(tmp_path / "again", session_params())
    # as a user's shell has it: no PYTHONPATH, the venv not on PATH until activated
    env.pop("PYTHONPATH")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(BIN))
    activate = BIN / "activate"
    enter = f"source {activate} && " if activate.is_file() else f"export PATH={BIN}:$PATH && "
    done = subprocess.run(["bash", "-c", enter + "dvc repro"], cwd=path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, again = yaml.safe_load(workspace.first_lock), yaml.safe_load((path / "dvc.lock").read_text())
    for stage, record in first["stages"].items():
        assert again["stages"][stage]["outs"] == record["outs"], f"stage {stage}: outputs differ"
    assert (path / "dvc.lock").read_text() == workspace.first_lock
    # nothing DVC tracks holds a time or a speed
    for name in ("reports/train_metrics.json", "reports/tune.json", "reports/metrics.json", "reports/tune/run.json",
                 "reports/tune/scores.json", "reports/evaluate/scores.json"):
        text = (path / name).read_text()
        assert "seconds" not in text and "mlflow_run_id" not in text, name
    assert "tokens_per_s" not in (path / "reports/train_curve.csv").read_text()


def test_a_failed_run_loses_nothing_dvc_checkout_restores_every_output(workspace, tmp_path):
    """DVC deletes a stage's outputs before running it; a stage that then refuses its params (exit 2)
    leaves them gone, and ``dvc checkout`` brings every one back from the cache (no output is
    ``cache: false``)."""
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "plots_html"))
    env = {**workspace.env, "PYTHONPATH": str(copy), "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}
    subprocess.run(["git", "checkout", "-q", "--", "params.yaml", "dvc.lock"], cwd=copy, env=env, check=True)
    subprocess.run([str(BIN / "dvc"), "checkout", "-q"], cwd=copy, env=env, check=True, capture_output=True)
    kept = {name: (copy / name).read_bytes() for name in (
        "reports/train_curve.csv", "reports/valid_curve.csv", "reports/train_metrics.json", "reports/tune.json",
        "reports/metrics.json", "models/model.pt")}
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["train"]["max_tokens"] = -5
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # `make run` checks first and runs nothing
    checked = subprocess.run([str(BIN / "python"), "-m", "pipeline.config"], cwd=copy, env=env,
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 2
    assert checked.stderr.strip() == "error: params.yaml: train.max_tokens must be a positive integer, got -5"
    # plain `dvc repro`: the train stage refuses, after DVC removed its outputs
    refused = subprocess.run([str(BIN / "dvc"), "repro"], cwd=copy, env=env, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0
    assert "train.max_tokens must be a positive integer" in refused.stdout + refused.stderr
    assert not (copy / "reports/train_curve.csv").exists()
    subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=copy, env=env, check=True)
    restored = subprocess.run([str(BIN / "dvc"), "checkout"], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=300)
    assert restored.returncode == 0, restored.stderr
    for name, content in kept.items():
        assert (copy / name).read_bytes() == content, name
    status = subprocess.run([str(BIN / "dvc"), "status"], cwd=copy, env=env, capture_output=True, text=True,
                            timeout=300)
    assert "Data and pipelines are up to date" in status.stdout, status.stdout


def test_a_raw_run_stores_no_text_form(workspace):
    """The default form is stored nowhere: a raw run's token stats, checkpoints, averaged model and
    reports are the bytes they were before text forms existed."""
    from pipeline.text.names import CHECKPOINT_KEY
    from transformer.checkpoint import load_checkpoint

    root = workspace.path
    assert set(json.loads((root / "data/tokens/stats.json").read_text())) == {"vocab_size", "splits", "model_from"}
    for path in sorted((root / "models/checkpoints").glob("*.pt")):
        checkpoint = load_checkpoint(path)
        assert CHECKPOINT_KEY not in checkpoint and CHECKPOINT_KEY not in checkpoint["callbacks"], path
    assert CHECKPOINT_KEY not in load_checkpoint(root / "models/model.pt")
    tune = json.loads(workspace.first_outputs["reports/tune/scores.json"])
    evaluate = json.loads(workspace.first_outputs["reports/evaluate/scores.json"])
    assert "measure" not in tune and "measure" not in tune["chosen"]
    assert not any("measure" in m for group in ("test", "dev") for m in evaluate[group].values())
