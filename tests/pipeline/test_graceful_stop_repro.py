"""A preempted ``dvc repro`` (#34): the train stage gets SIGTERM mid-training, writes its resume point
and exits 143, so ``dvc repro`` fails and records nothing; ``dvc repro`` again resumes it, and the
workspace ends with the ``dvc.lock`` of the uninterrupted run (the session's pipeline workspace),
hash for hash: the checkpoints averaged, the curves, the metrics, and so every later stage's
outputs, which DVC then finds unchanged and does not rerun. The model has dropout (0.1), so the
RNG state travels through the resume point too.

One extra training of the tiny workspace (40 updates, stopped once): the copy starts from the first
run's outputs, less the train stage's. The SIGTERM goes to the training process (found under
``dvc repro`` by its command line) once its first checkpoint (update 10 of 40) is on disk."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import psutil
import pytest
import yaml

from transformer.training.checkpoint_files import list_checkpoints

from .conftest import BIN, Workspace

pytestmark = [pytest.mark.pipeline, pytest.mark.training]


def training_process(repro: subprocess.Popen, limit_s: float = 300) -> psutil.Process:
    """The train stage's process under ``repro`` (DVC starts it through a shell)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert repro.poll() is None, "dvc repro ended before the train stage started"
        for child in psutil.Process(repro.pid).children(recursive=True):
            try:
                if "pipeline.stages.train" in " ".join(child.cmdline()) and "python" in child.name():
                    return child
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.02)
    raise AssertionError(f"no train stage under dvc repro after {limit_s} s")


def test_sigterm_and_resume_through_dvc_repro_give_the_uninterrupted_dvc_lock(workspace: Workspace, tmp_path):
    first = yaml.safe_load(workspace.first_lock)
    assert yaml.safe_load(workspace.first_params)["model"]["dropout"] > 0
    copy = tmp_path / "repo"
    shutil.copytree(workspace.path, copy, symlinks=True,
                    ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts", "plots_html"))
    env = {**workspace.env, "PYTHONPATH": str(copy), "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}"}
    (copy / "params.yaml").write_text(workspace.first_params)   # later tests may run experiments in it
    (copy / "dvc.lock").write_text(workspace.first_lock)
    subprocess.run([str(BIN / "dvc"), "checkout", "-q"], cwd=copy, env=env, check=True, capture_output=True)
    checkpoints = copy / "models" / "checkpoints"
    shutil.rmtree(checkpoints)   # persist: true, so DVC would resume from it: the training starts over
    for out in ("reports/train_metrics.json", "reports/train_curve.csv", "reports/valid_curve.csv"):
        (copy / out).unlink()

    log = (tmp_path / "stopped.log").open("w+")
    repro = subprocess.Popen([str(BIN / "dvc"), "repro"], cwd=copy, env=env, stdout=log, stderr=subprocess.STDOUT,
                             text=True)
    try:
        trainer = training_process(repro)
        deadline = time.monotonic() + 300
        while not list_checkpoints(checkpoints):
            assert trainer.is_running() and time.monotonic() < deadline, "no checkpoint before the training ended"
            time.sleep(0.01)
        trainer.send_signal(signal.SIGTERM)
        code = repro.wait(timeout=300)
    finally:
        if repro.poll() is None:
            repro.kill()
            repro.wait(timeout=30)
    log.seek(0)
    stopped = log.read()
    assert code != 0, stopped[-3000:]
    assert "train: stopped by signal 15 after update " in stopped and "exited with 143" in stopped, stopped[-3000:]
    assert "Running stage 'average'" not in stopped   # DVC ran nothing on the partial training
    assert not (copy / "reports/train_metrics.json").exists()
    newest = list_checkpoints(checkpoints, resume_points=True)[-1]
    step = int(newest.name.split("_")[1].split(".")[0])
    assert 10 <= step < first["stages"]["train"]["params"]["params.yaml"]["train"]["max_steps"], newest
    assert newest.name.endswith(".resume.pt") or step % 10 == 0, newest   # on the grid its checkpoint holds it

    again = subprocess.run([str(BIN / "dvc"), "repro"], cwd=copy, env=env, capture_output=True, text=True,
                           timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert f"resuming from step {step} " in out and "Running stage 'train'" in out, out[-3000:]
    assert "Running stage 'average'" not in out, out[-3000:]   # its input, the checkpoints, is unchanged
    assert not list(checkpoints.glob("*.resume.pt"))
    lock = yaml.safe_load((copy / "dvc.lock").read_text())
    for stage, record in first["stages"].items():
        assert lock["stages"][stage]["outs"] == record["outs"], f"stage {stage}: outputs differ"
    assert (copy / "dvc.lock").read_text() == workspace.first_lock
