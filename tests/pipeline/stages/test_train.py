"""pipeline/stages/train.py: checkpoints, curves and metrics; a killed run resumes instead of restarting."""

import csv
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from transformer.checkpoint import load_checkpoint

pytestmark = pytest.mark.fast


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_checkpoints_curves_and_metrics(workspace):
    ckpts = sorted(p.name for p in (workspace.path / "models/checkpoints").glob("checkpoint_*.pt"))
    assert ckpts == ["checkpoint_00000020.pt", "checkpoint_00000030.pt", "checkpoint_00000040.pt"]  # keep 3
    train = rows(workspace.path / "reports/train_curve.csv")
    assert [int(r["step"]) for r in train] == [10, 20, 30, 40]
    assert {"loss", "nll", "ppl", "lr", "grad_norm"} <= set(train[0])
    assert "target_tokens_per_s" not in train[0]   # the machine's speed: console and MLflow, not DVC's files
    assert float(train[-1]["loss"]) < float(train[0]["loss"])  # it learns
    valid = rows(workspace.path / "reports/valid_curve.csv")
    assert [int(r["step"]) for r in valid] == [20, 40]
    metrics = json.loads((workspace.path / "reports/train_metrics.json").read_text())
    assert metrics["steps"] == 40 and metrics["parameters"] > 0 and "train_seconds" not in metrics
    # the headline (docs/metrics.md): the final validation's loss and NLL are the curve's last row
    assert set(metrics) == {"steps", "epochs", "parameters", "valid_ppl"}
    assert float(valid[-1]["ppl"]) == pytest.approx(metrics["valid_ppl"], rel=1e-5)   # the CSV's 6 digits
    state = load_checkpoint(workspace.path / "models/checkpoints/checkpoint_00000040.pt")
    assert state["step"] == 40 and state["model_config"]["vocab_size"] == 400
    # no run id and no wall time in a checkpoint of a run limited by updates (a DVC output)
    assert state["elapsed_seconds"] == 0.0 and "curves" in state["callbacks"]
    assert "mlflow_run_id" not in state["callbacks"]


def endless_training_copy(workspace, tmp_path) -> tuple:
    """A copy of the workspace whose training would run for ever (a checkpoint every 5 updates), its
    checkpoints removed: a stage to stop from outside. Returns the copy and its params."""
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts"))
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["train"].update(max_steps=100000, checkpoint_every_steps=5, keep_checkpoints=2, validate_every=0)
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    for old in (copy / "models/checkpoints").glob("*.pt"):
        old.unlink()
    return copy, params


def test_killed_training_resumes_from_its_last_checkpoint(workspace, tmp_path):
    """SIGKILL during training, run the stage again: it resumes from the newest checkpoint."""
    copy, params = endless_training_copy(workspace, tmp_path)
    env = {**workspace.env, "PYTHONPATH": str(copy), "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((copy / "models/checkpoints").glob("checkpoint_0000002*.pt")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = sorted((copy / "models/checkpoints").glob("checkpoint_*.pt"))
    assert saved, "no checkpoint was written before the kill"
    last_step = int(saved[-1].stem.split("_")[1])
    assert last_step >= 20
    params["train"]["max_steps"] = last_step + 5
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    again = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from step {last_step}" in again.stdout
    assert json.loads((copy / "reports/train_metrics.json").read_text())["steps"] == last_step + 5


def test_a_preempted_training_fails_the_stage_after_writing_its_resume_point(workspace, tmp_path):
    """SIGTERM to the stage (a scheduler's preemption): the trainer stops after the update, writes a
    resume point, and the stage exits 143, so that DVC records no finished training and runs no
    average; the metrics file of the finished run before it is left as it was."""
    copy, params = endless_training_copy(workspace, tmp_path)
    metrics_before = (copy / "reports/train_metrics.json").read_bytes()
    env = {**workspace.env, "PYTHONPATH": str(copy), "PIPELINE_TRACKING": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list((copy / "models/checkpoints").glob("checkpoint_*.pt")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by signal 15" in err
    # The state of the update it stopped after: a resume point, or the checkpoint of that update when
    # the signal came while it was written (the trainer writes no copy of it).
    step = int(re.search(r"stopped by signal 15 after update (\d+)", err).group(1))
    assert {f"checkpoint_{step:08d}.resume.pt", f"checkpoint_{step:08d}.pt"} & {
        p.name for p in (copy / "models/checkpoints").glob("checkpoint_*.pt")}, "no resume point"
    assert (copy / "reports/train_metrics.json").read_bytes() == metrics_before


def test_a_training_cut_by_the_clock_fails_the_stage_and_its_rerun_says_what_it_did(workspace, tmp_path):
    """``train.max_minutes`` running out before ``max_steps``: a resume point and exit 1 with one line
    (DVC records no finished training, average never sees it), the metrics of the run before untouched.
    Its rerun without the budget trains the remaining updates and says how many, in how long, from where."""
    copy, params = endless_training_copy(workspace, tmp_path)
    metrics_before = (copy / "reports/train_metrics.json").read_bytes()
    params["train"].update(max_minutes=0.02)   # 1.2 s of training
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**workspace.env, "PYTHONPATH": str(copy), "PIPELINE_TRACKING": "off"}
    cut = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=300)
    assert cut.returncode == 1, cut.stdout[-2000:] + cut.stderr[-2000:]
    line = cut.stderr.strip().splitlines()[-1]
    step = int(re.fullmatch(r"train: the clock \(train\.max_minutes 0\.02\) ran out after update (\d+), before "
                            r"train\.max_steps 100000; its resume point is written, .*", line).group(1))
    assert step > 0 and "trained " not in cut.stdout
    names = {p.name for p in (copy / "models/checkpoints").glob("checkpoint_*.pt")}
    assert {f"checkpoint_{step:08d}.resume.pt", f"checkpoint_{step:08d}.pt"} & names, names
    assert (copy / "reports/train_metrics.json").read_bytes() == metrics_before

    params["train"].update(max_minutes=0, max_steps=step + 3)
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    rerun = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert re.search(rf"^trained 3 steps in [\d.]+ s, resumed from step {step} \(step {step + 3} now\): ",
                     rerun.stdout, re.MULTILINE), rerun.stdout[-2000:]
    assert json.loads((copy / "reports/train_metrics.json").read_text())["steps"] == step + 3


def test_bad_params_stop_before_any_work(workspace, tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path / "data", copy / "data")
    params = yaml.safe_load((workspace.path / "params.yaml").read_text())
    params["train"]["max_tokens"] = -5
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=workspace.env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: params.yaml: train.max_tokens must be a positive integer, got -5"]
    assert not (copy / "models").exists()


def init_copy(workspace, tmp_path, **train):
    """A copy of the workspace without checkpoints or MLflow store, its params edited."""
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "checkpoint_*.pt"))
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["train"].update(train)
    params["tokenizer"]["model_from"] = "data/tokenizer/spm.model"   # the tokenizer models/model.pt was trained with
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**workspace.env, "PYTHONPATH": str(copy), "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}
    return copy, params, env


def test_init_from_fine_tunes_the_averaged_model(workspace, tmp_path):
    """train.init_from = the workspace's averaged model: the new training's first logged loss is the
    trained model's, far below the first loss of the training from random weights."""
    import hashlib

    from mlflow.tracking import MlflowClient

    copy, _, env = init_copy(workspace, tmp_path, init_from="models/model.pt", max_steps=10, validate_every=0)
    sha = hashlib.sha256((copy / "models/model.pt").read_bytes()).hexdigest()
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"initialised from models/model.pt (sha256 {sha[:12]})" in done.stdout
    scratch = rows(workspace.path / "reports/train_curve.csv")
    tuned = rows(copy / "reports/train_curve.csv")
    assert [int(r["step"]) for r in tuned] == [10]
    # Mean loss of steps 1-10: from random weights 5.76 (5.38 at step 40); from the averaged model
    # 5.38, what the scratch run reached (the tiny run learns little: ln(400) = 5.99).
    first, last = float(scratch[0]["loss"]), float(scratch[-1]["loss"])
    assert last - 0.1 < float(tuned[0]["loss"]) < (first + last) / 2
    uri = env["MLFLOW_TRACKING_URI"]
    (run,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("test-experiment").experiment_id])
    assert run.data.params["train.init_from"] == "models/model.pt"
    assert run.data.params["tokenizer.model_from"] == "data/tokenizer/spm.model"
    assert run.data.tags["train.init_sha256"] == sha
    assert load_checkpoint(copy / "models/checkpoints/checkpoint_00000010.pt")["fingerprint"]["init"] == sha


def test_init_from_another_model_config_stops_with_one_line(workspace, tmp_path):
    copy, params, env = init_copy(workspace, tmp_path, init_from="models/model.pt")
    params["model"]["d_ff"] = 48
    (copy / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: train.init_from: models/model.pt was trained with another model config: d_ff 64 (this model: 48)"]
    assert not list((copy / "models/checkpoints").glob("*.pt"))


def test_fine_tuning_keeps_its_weights_text_form(tmp_path):
    """train.init_from of the literature's form onto raw token stores (or the reverse) is one ParamsError
    naming both forms, before any training; the same form passes."""
    from pipeline.config.errors import ParamsError
    from pipeline.stages.train import check_init_form
    from pipeline.text.names import TextForm
    from transformer.checkpoint import save_checkpoint

    literature = TextForm("lc_norm_tok", "en", "de")
    weights = tmp_path / "model.pt"
    save_checkpoint(weights, {"model_config": {}, "model": {}, "text_form": literature.entry()})
    check_init_form(str(weights), literature)
    with pytest.raises(ParamsError) as err:
        check_init_form(str(weights), TextForm())
    assert str(err.value) == (f"params.yaml: train.init_from {weights} was trained on 'lc_norm_tok' text but the "
                              "token stores hold 'raw' text (tokenizer.text_form): fine-tuning keeps its weights' "
                              "form, set tokenizer.text_form to lc_norm_tok")
