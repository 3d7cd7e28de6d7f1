"""The stages with tracking off (``PIPELINE_TRACKING=off``), on a machine where MLflow cannot even be
imported (as on the GPU machine of the campaign): they run, record nothing, and write the same outputs
as the tracked run of the session's workspace."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.fast

STAGES = ("train", "average", "export", "tune", "evaluate")
BLOCKER = "raise ImportError('mlflow is not installed on this machine (a test blocks it)')\n"


def test_stages_without_mlflow_write_what_the_tracked_run_wrote(workspace, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, ignore=shutil.ignore_patterns(
        "mlflow.db", "mlartifacts", "models", "reports", ".dvc", ".git"))
    # The first run's params: a test that ran before this one in the same process may have left an
    # experiment's (dvc exp run -S evaluate.beam_size=1) in the workspace.
    (copy / "params.yaml").write_text(workspace.first_params)
    (tmp_path / "blocked" / "mlflow").mkdir(parents=True)
    (tmp_path / "blocked" / "mlflow" / "__init__.py").write_text(BLOCKER)
    env = {**workspace.env, "PYTHONPATH": f"{tmp_path / 'blocked'}:{copy}", "PIPELINE_TRACKING": "off",
           "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}
    probe = subprocess.run([sys.executable, "-c", "import mlflow"], env=env, capture_output=True, text=True)
    assert "a test blocks it" in probe.stderr
    for stage in STAGES:
        result = subprocess.run([sys.executable, "-m", f"pipeline.stages.{stage}"], cwd=copy, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{stage}: {result.stderr[-2000:]}"
        assert "MLflow" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert not (copy / "mlflow.db").exists() and not (copy / "mlartifacts").exists()
    # Tracking decides what is recorded, never what is made: the files of the tracked first run (later
    # tests may run experiments in the session's workspace, so its first dvc.lock and reports).
    outs = {o["path"]: o["md5"] for stage in yaml.safe_load(workspace.first_lock)["stages"].values()
            for o in stage.get("outs", []) if "md5" in o and not o["md5"].endswith(".dir")}
    assert hashlib.md5((copy / "models/model.pt").read_bytes()).hexdigest() == outs["models/model.pt"]
    for output in ("reports/metrics.json", "reports/tune.json", "reports/train_curve.csv", "reports/valid_curve.csv"):
        assert (copy / output).read_text() == workspace.first_outputs[output], output


def test_a_bad_tracking_switch_stops_the_stage_with_one_line(workspace):
    model = workspace.path / "models/model.pt"
    before = model.stat().st_mtime_ns
    env = {**workspace.env, "PIPELINE_TRACKING": "sometimes"}
    result = subprocess.run([sys.executable, "-m", "pipeline.stages.average"], cwd=workspace.path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert model.stat().st_mtime_ns == before   # stopped before any work
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: PIPELINE_TRACKING='sometimes': expected on or off (1/0, true/false, "
                                     "yes/no)")
