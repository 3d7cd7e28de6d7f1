"""Crash-safe training: real training processes are SIGKILLed at random steps, and once in the
middle of a checkpoint write; restarted until done, they end bit-identical (torch.equal on
every tensor) to a run that was never interrupted.

The kill points come from a seeded RNG; the seed is printed (``-s`` shows it) and
``RELIABILITY_SEED=<n>`` replays a run. The training is ``tests/reliability/train_child.py``:
the tiny preset with dropout 0.3 (the RNG state matters), gradient accumulation over 2
batches (a kill can land between the two halves of an update), a checkpoint every 2 updates
and several epochs (the data position and the per-epoch order matter).

The train *stage* (MLflow run, curves) after a SIGKILL is covered at the end of this file:
tests/pipeline/stages/test_train.py checks that a killed stage resumes from its newest
checkpoint, but not that it continues the same MLflow run and the same curves.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from transformer.checkpoint import load_checkpoint
from transformer.training.batching import TokenBatchSampler
from transformer.training.token_store import write_token_store
from transformer.training.trainer import list_checkpoints

from ..fakes import params_with

pytestmark = [pytest.mark.pipeline, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().with_name("train_child.py")
N_STEPS = 30          # 6 epochs of 5 updates (10 batches of <= 96 tokens, 2 batches an update)
EVERY = 2             # train_child's checkpoint_every_steps
SEED = int(os.environ.get("RELIABILITY_SEED") or random.SystemRandom().randrange(2**31))


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    pairs = [(rng.integers(4, 40, size=rng.integers(2, 12)).tolist(),
              rng.integers(4, 40, size=rng.integers(2, 12)).tolist()) for _ in range(80)]
    store = write_token_store(tmp_path_factory.mktemp("kill") / "train", pairs, vocab_size=40)
    batches = TokenBatchSampler(store.lengths["src"], store.lengths["tgt"], 96, seed=11, max_positions=256).batches(0)
    assert len(batches) // 2 * 2 < N_STEPS  # several epochs
    return store.path


class Child:
    """One training process; its output lines are read as they come."""

    def __init__(self, store: Path, checkpoint_dir: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(store), str(checkpoint_dir), str(N_STEPS), *extra],
            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.lines: list[str] = []

    def wait_for(self, line: str, timeout: float = 60) -> bool:
        """Read output until ``line`` (True) or the end of the output (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.proc.stdout.readline()
            if not got:
                return False
            self.lines.append(got.strip())
            if got.strip() == line:
                return True
        raise AssertionError(f"no {line!r} within {timeout} s; output so far: {self.lines[-5:]}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        assert self.proc.returncode == -signal.SIGKILL

    def finish(self, timeout: float = 60) -> None:
        out, err = self.proc.communicate(timeout=timeout)
        self.lines += [line.strip() for line in out.splitlines()]
        assert self.proc.returncode == 0, err[-3000:]

    @property
    def resumed_from(self) -> int:
        return int(next(line for line in self.lines if line.startswith("resumed ")).split()[1])

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


def newest_step(directory: Path) -> int:
    found = list_checkpoints(directory)
    return int(found[-1].stem.split("_")[1]) if found else 0


def assert_same_state(a: Any, b: Any, where: str = "checkpoint") -> int:
    """torch.equal on every tensor, == on every other value; returns the number of tensors compared."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
        return 1
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        return sum(assert_same_state(a[k], b[k], f"{where}.{k}") for k in a)
    if isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        return sum(assert_same_state(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    assert a == b, f"{where}: {a!r} != {b!r}"
    return 0


def final_state(directory: Path) -> dict[str, Any]:
    state = load_checkpoint(directory / f"checkpoint_{N_STEPS:08d}.pt")
    state.pop("elapsed_seconds")  # wall time, the one thing a restart may change
    return state


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted") / "ckpt"
    child = Child(store, directory)
    try:
        child.finish()
    finally:
        child.close()
    assert child.resumed_from == 0 and f"done {N_STEPS}" in " ".join(child.lines)
    return final_state(directory)


def test_sigkill_at_random_steps_then_resume_is_bit_identical(store, uninterrupted, tmp_path):
    rng = random.Random(SEED)
    kill_points = sorted(rng.sample(range(3, N_STEPS - 3), 3))
    print(f"RELIABILITY_SEED={SEED}: SIGKILL at steps {kill_points}")
    directory = tmp_path / "ckpt"
    expected_resume = 0
    for point in kill_points:
        child = Child(store, directory)
        try:
            start = max(point, expected_resume + 1)
            assert child.wait_for(f"step {start}"), f"the run ended before step {start}: {child.lines[-5:]}"
            child.kill()
        finally:
            child.close()
        assert child.resumed_from == expected_resume
        expected_resume = newest_step(directory)
        # The newest checkpoint is whole and loads; no temporary file is taken for one.
        assert load_checkpoint(list_checkpoints(directory)[-1])["step"] == expected_resume
        assert all(p.name.startswith("checkpoint_") for p in list_checkpoints(directory))
        print(f"killed after 'step {start}': newest checkpoint {expected_resume}, "
              f"{len(list(directory.glob('.*.tmp')))} temporary file(s) left by the kill")
    child = Child(store, directory)
    try:
        child.finish()
    finally:
        child.close()
    assert child.resumed_from == expected_resume > 0
    compared = assert_same_state(uninterrupted, final_state(directory))
    # model + Adam moments + RNG state: every tensor of the final state was compared
    assert compared > 3 * len(uninterrupted["model"])
    assert uninterrupted["step"] == N_STEPS and uninterrupted["epoch"] >= 5


def test_sigkill_during_a_checkpoint_write(store, uninterrupted, tmp_path):
    """The child stops after writing checkpoint STEP's temporary file, before the rename, and is
    SIGKILLed there: the previous checkpoint is the newest, intact and loadable; the temporary
    file is never taken for a checkpoint; the restarted run still ends bit-identical."""
    step = random.Random(SEED + 1).randrange(2 * EVERY, N_STEPS - EVERY, EVERY)
    print(f"RELIABILITY_SEED={SEED}: SIGKILL while writing checkpoint {step}")
    directory, flag = tmp_path / "ckpt", tmp_path / "paused"
    child = Child(store, directory, "--pause-before-rename", str(step), str(flag))
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert child.proc.poll() is None, child.proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the child never reached the checkpoint write"
            time.sleep(0.02)
        staged = Path(flag.read_text())
        assert staged.parent == directory and staged.stat().st_size > 0
        child.kill()
    finally:
        child.close()

    assert not (directory / f"checkpoint_{step:08d}.pt").exists()
    assert staged.exists()                                    # the half-done write is left over ...
    assert staged not in list_checkpoints(directory)          # ... and not taken for a checkpoint
    assert newest_step(directory) == step - EVERY
    previous = load_checkpoint(list_checkpoints(directory)[-1])
    assert previous["step"] == step - EVERY and previous["model"]

    child = Child(store, directory)
    try:
        child.finish()
    finally:
        child.close()
    assert child.resumed_from == step - EVERY
    assert not staged.exists()                                # the resumed run removed it
    assert_same_state(uninterrupted, final_state(directory))


# ----------------------------------------------------------------------------- the train stage


TINY_STAGE = {
    "model": {"preset": "tiny", "dropout": 0.1},
    "train": {"max_epochs": 0, "max_steps": 12, "max_minutes": 0, "max_tokens": 96, "update_freq": 2,
              "warmup_steps": 4, "lr_scale": 1.0, "checkpoint_every_steps": 2,
              "checkpoint_every_minutes": 0, "keep_checkpoints": 3,
              "log_every": 1, "validate_every": 4, "precision": "fp32", "device": "cpu"},
    "tracking": {"registered_model": "kill-test"},
}


def stage_workspace(root: Path, store: Path, experiment: str) -> tuple[Path, dict[str, str]]:
    """A folder the train stage runs in: params.yaml (tiny) and token stores (no git, no DVC);
    the MLflow store is one SQLite file beside it, shared by the test's workspaces."""
    params = params_with(TINY_STAGE)
    params["tracking"]["experiment"] = experiment
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    tokens = root / "data" / "tokens"
    tokens.mkdir(parents=True)
    shutil.copytree(store, tokens / "train")
    shutil.copytree(store, tokens / params["data"]["valid_set"])
    # What the tokenizer stage writes beside its stores (raw text: no text_form entry); the train stage reads it.
    (tokens / "stats.json").write_text('{"vocab_size": 0, "splits": {}, "model_from": ""}')
    # The tokenizer that made the (synthetic) stores: the train stage reads only its sha256.
    tokenizer = root / "data" / "tokenizer" / "spm.model"
    tokenizer.parent.mkdir(parents=True)
    tokenizer.write_bytes(b"the tokenizer of the synthetic token stores")
    env = {k: v for k, v in child_env().items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{root.parent / 'mlflow.db'}"
    return root, env


def run_stage(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def curve(path: Path) -> list[tuple[str, str, str]]:
    """(step, loss, nll) of a curve file: what a restart must not change (tokens/s may)."""
    with open(path) as f:
        return [(r["step"], r["loss"], r["nll"]) for r in csv.DictReader(f)]


def test_killed_train_stage_continues_its_mlflow_run_and_curves(store, tmp_path):
    from mlflow.tracking import MlflowClient

    whole, whole_env = stage_workspace(tmp_path / "whole", store, "never-killed")
    run_stage(whole, whole_env)

    root, env = stage_workspace(tmp_path / "killed", store, "kill-test")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.stages.train"], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seen = []
        for line in proc.stdout:   # the stage prints "step      7  epoch ..." after each update
            seen.append(line)
            if line.split()[:2] == ["step", "7"]:
                break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-2000:]
    first_run = next(line.split()[2] for line in seen if line.startswith("MLflow: run "))
    killed_at = newest_step(root / "models" / "checkpoints")
    assert 6 <= killed_at < 12

    again = run_stage(root, env)
    assert f"resuming from step {killed_at}" in again.stdout
    assert f"MLflow: resuming run {first_run}" in again.stdout

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("kill-test")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [first_run]          # one run, continued
    assert runs[0].info.status == "FINISHED"
    logged = {m.step for m in client.get_metric_history(first_run, "train/loss")}
    print(f"killed at step 7, resumed from {killed_at}; train/loss steps in the run: {sorted(logged)}")
    # What the killed process had not sent yet (it sends every 5 s) is sent again from the curves
    # kept in the checkpoint: the run's histories have every step, as the curve files do.
    assert logged == set(range(1, 13))
    assert "metric values the interrupted run had not sent" in again.stdout
    valid_steps = [r[0] for r in curve(root / "reports" / "valid_curve.csv")]
    assert sorted({m.step for m in client.get_metric_history(first_run, "valid/loss")}) == sorted(
        {int(s) for s in valid_steps})
    # The curves continue from the checkpoint: the same rows as the run that was never killed.
    assert curve(root / "reports" / "train_curve.csv") == curve(whole / "reports" / "train_curve.csv")
    assert [r[0] for r in curve(root / "reports" / "train_curve.csv")] == [str(s) for s in range(1, 13)]
    assert curve(root / "reports" / "valid_curve.csv") == curve(whole / "reports" / "valid_curve.csv")
    final = load_checkpoint(root / "models" / "checkpoints" / "checkpoint_00000012.pt")
    reference = load_checkpoint(whole / "models" / "checkpoints" / "checkpoint_00000012.pt")
    assert_same_state(reference["model"], final["model"], "model")
    assert_same_state(reference["optimizer"], final["optimizer"], "optimizer")
