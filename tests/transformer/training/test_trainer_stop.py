"""transformer/training/trainer.py's ends in one process: the ``max_minutes`` clock before the training's
length stops at a resume point (resumed with a larger budget: the weights of an uninterrupted run),
the clock as the only limit is the training's end, an epoch that yields no update is one clear
error, and the pairs the sampler skips are reported."""

from __future__ import annotations

import pytest
import torch

from transformer.training.token_store import write_token_store
from transformer.training.trainer import Trainer, TrainerCallback, list_checkpoints

from ..conftest import tiny_model
from .test_trainer import Recorder, config, random_pairs

pytestmark = pytest.mark.fast


class SpendBudgetAt(TrainerCallback):
    """Marks the ``max_minutes`` budget spent once update ``step`` is logged (no waiting on a clock)."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer = step, None

    def on_train_start(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.step:
            self.trainer.elapsed_seconds = 60 * self.trainer.config.max_minutes


@pytest.fixture
def store(tmp_path):
    return write_token_store(tmp_path / "train", random_pairs(40), vocab_size=30)


def test_the_clock_before_the_length_stops_at_a_resume_point(store, tmp_path):
    cfg = config(max_steps=7, max_minutes=60.0, log_every=2, checkpoint_every_steps=2, keep_checkpoints=5)
    recorder = Recorder()
    stopped = Trainer(tiny_model(vocab_size=30), cfg, store, checkpoint_dir=tmp_path / "c",
                      callbacks=[recorder, SpendBudgetAt(4)])
    stopped.train()
    assert stopped.step == 4 and stopped.stopped_early and stopped.stop_requested
    assert [s for s, _ in recorder.logs] == [2, 4]   # nothing more logged at the stop
    # Update 4 is on the checkpoint grid: its checkpoint already holds the state, no resume point.
    assert [p.name for p in list_checkpoints(tmp_path / "c", resume_points=True)] == [
        "checkpoint_00000002.pt", "checkpoint_00000004.pt"]

    again = Trainer(tiny_model(vocab_size=30), cfg, store, checkpoint_dir=tmp_path / "c")
    again.resume()
    again.train()   # the budget saved in the checkpoint is spent: stops at once, where it was
    assert again.step == 4 and again.stopped_early

    larger = dict(max_steps=7, max_minutes=120.0, log_every=2, checkpoint_every_steps=2, keep_checkpoints=5)
    resumed = Trainer(tiny_model(vocab_size=30), config(**larger), store, checkpoint_dir=tmp_path / "c")
    resumed.resume()
    resumed.train()
    assert resumed.step == 7 and not resumed.stopped_early
    straight = Trainer(tiny_model(vocab_size=30), config(**larger), store)
    straight.train()
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name


def test_the_clock_as_the_only_limit_is_the_end_of_the_training(store, tmp_path):
    cfg = config(max_steps=0, max_minutes=60.0, log_every=2, checkpoint_every_steps=2)
    recorder = Recorder()
    trainer = Trainer(tiny_model(vocab_size=30), cfg, store, valid_data=store, checkpoint_dir=tmp_path / "c",
                      callbacks=[recorder, SpendBudgetAt(2)])
    trainer.train()
    assert trainer.step == 2 and not trainer.stopped_early and not trainer.stop_requested
    assert [s for s, _ in recorder.validations] == [2]   # validated at its end
    assert [p.name for p in list_checkpoints(tmp_path / "c", resume_points=True)] == ["checkpoint_00000002.pt"]


# Fewer batches than update_freq; every pair wider than max_tokens (skipped), so no batch at all.
@pytest.mark.parametrize("overrides", [dict(update_freq=40), dict(max_tokens=1, update_freq=1)])
def test_an_epoch_that_yields_no_update_is_one_clear_error(store, overrides):
    with pytest.raises(ValueError) as err:
        Trainer(tiny_model(vocab_size=30), config(max_steps=5, **overrides), store)
    message = str(err.value)
    assert message.startswith("an epoch of the training data yields no update: 40 pairs")
    for knob in ("TrainConfig.max_tokens", "TrainConfig.update_freq", "fewer processes", "data.limit_train_pairs"):
        assert knob in message
    assert f"TrainConfig.update_freq={overrides['update_freq']} x 1 process(es)" in message


def test_skipped_pairs_are_counted_and_reported(tmp_path, capsys):
    long_pairs = [([5] * 30, [6] * 30)] * 3   # 31 tokens with EOS: wider than max_tokens
    store = write_token_store(tmp_path / "train", random_pairs(40) + long_pairs, vocab_size=30)
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=2, max_tokens=24), store)
    stats = trainer.train()
    assert stats["train/skipped_pairs"] == 3
    assert "3 of 43 training pairs skipped: longer than TrainConfig.max_tokens=24" in capsys.readouterr().out
