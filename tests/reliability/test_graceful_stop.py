"""A graceful stop changes no output: a training stopped by SIGTERM or SIGINT between two log lines
and two checkpoints, then resumed, writes byte for byte the files of a training never stopped: the
train and valid curves (the pipeline's ``CurveWriter``, as the train stage writes them), every
checkpoint kept, and the averaged model (§6.1). The stop leaves a resume point, which is never
among the checkpoints averaged and is gone once the next checkpoint is written.

The stop lands at update 5 (off the log grid of 3 and the checkpoint grid of 4) from the
validation callback of that update: no timing involved."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.figures.curves import CurveWriter
from transformer.checkpoint import average_checkpoints, save_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import TokenStore, write_token_store
from transformer.training.trainer import TrainConfig, Trainer, TrainerCallback, list_checkpoints

pytestmark = pytest.mark.training

CONFIG = dict(max_steps=14, max_tokens=64, warmup_steps=4, log_every=3, validate_every=5, checkpoint_every_steps=4,
              keep_checkpoints=2, precision="fp32", device="cpu", seed=3, clip_norm=1.0)
STOP_AT = 5


class SignalAt(TrainerCallback):
    """Sends ``signum`` to this process once, when update ``step`` is validated."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum, self.step = signum, step

    def on_validate(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step:
            os.kill(os.getpid(), self.signum)


def run(store: Path, signum: int | None = None) -> Trainer:
    """One training process's work in the current folder, as the train stage does it: resume from
    ``ckpt`` with the curves kept in the checkpoint, train, write the curves."""
    curves = CurveWriter(Path("train_curve.csv"), Path("valid_curve.csv"), echo=False)
    torch.set_num_threads(1)   # as every run here: the module's fixture runs before the per-test setup
    torch.manual_seed(123)
    model = Transformer(build_config("tiny", 40, dropout=0.2, attention_dropout=0.1))  # the RNG state matters
    callbacks = [curves] + ([SignalAt(signum, STOP_AT)] if signum is not None else [])
    trainer = Trainer(model, TrainConfig(**CONFIG), TokenStore(store), valid_data=TokenStore(store),
                      checkpoint_dir=Path("ckpt"), callbacks=callbacks)
    restored = trainer.resume()
    if restored is not None:
        curves.restore(restored)
    trainer.train()
    save_checkpoint("model.pt", average_checkpoints(list_checkpoints("ckpt")[-2:]))   # the average stage
    return trainer


def outputs(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    rng = np.random.default_rng(5)
    pairs = [(rng.integers(4, 40, size=rng.integers(2, 10)).tolist(),
              rng.integers(4, 40, size=rng.integers(2, 10)).tolist()) for _ in range(48)]
    return write_token_store(tmp_path_factory.mktemp("stop") / "train", pairs, vocab_size=40).path


@pytest.fixture(scope="module")
def uninterrupted(store, tmp_path_factory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        run(store)
    return outputs(root)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopped_and_resumed_training_writes_the_bytes_of_an_uninterrupted_one(store, uninterrupted, signum,
                                                                               tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stopped = run(store, signum)
    assert stopped.step == STOP_AT and stopped.stopped_early
    # The stop logged nothing (the window of update 4-5 travels in the resume point) and left a resume
    # point beside the grid's checkpoint 4: the model averaged from it is of checkpoint 4 alone.
    assert [line.split(",")[0] for line in Path("train_curve.csv").read_text().splitlines()[1:]] == ["3"]
    assert [p.name for p in list_checkpoints("ckpt", resume_points=True)] == [
        "checkpoint_00000004.pt", "checkpoint_00000005.resume.pt"]

    resumed = run(store)
    assert resumed.step == CONFIG["max_steps"] and not resumed.stopped_early
    got = outputs(tmp_path)
    assert sorted(got) == sorted(uninterrupted) == [
        "ckpt/checkpoint_00000012.pt", "ckpt/checkpoint_00000014.pt", "model.pt", "train_curve.csv",
        "valid_curve.csv"]
    for name, data in uninterrupted.items():
        assert got[name] == data, name
