"""transformer/training/trainer.py on CUDA: fp16 loss scaling skips overflowing updates without advancing the
schedule, a resumed training continues exactly (CUDA RNG included: dropout draws from it), and
training under ``torchrun`` with an NCCL process group trains and resumes."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu import requires_cuda
from tests.transformer.conftest import tiny_model
from tests.transformer.training.test_trainer import WeightsAtLog, config, random_pairs
from transformer.checkpoint import load_checkpoint
from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.schedule import inverse_sqrt_lr
from transformer.training.token_store import write_token_store
from transformer.training.trainer import Trainer

pytestmark = [requires_cuda, pytest.mark.fast]
REPO = Path(__file__).resolve().parents[2]
NCCL_HELPER = Path(__file__).resolve().with_name("nccl_run.py")


@pytest.fixture
def store(tmp_path):
    return write_token_store(tmp_path / "train", random_pairs(40), vocab_size=30)


def update_error(run, reference, start):
    """|| (run - start) - (reference - start) || / || reference - start || over all weights."""
    diff = sum(float((run[n].double() - reference[n].double()).norm() ** 2) for n in start)
    moved = sum(float((reference[n].double() - start[n].double()).norm() ** 2) for n in start)
    return math.sqrt(diff / moved)


def test_fp16_overflow_skips_the_update_and_the_schedule(store):
    """The Trainer's own scaler (fp16 on CUDA), started at 2^24: the fp16 gradient of the logits,
    2^24 / target tokens, overflows, so the first updates are skipped and the scale halves until
    they fit. Skipped updates move neither the step count, nor the learning rate (update n runs at
    the rate of step n, eq. 3), nor the weights, nor Adam's state, and nan_policy "stop" ignores them."""
    recorder = WeightsAtLog()
    trainer = Trainer(tiny_model(vocab_size=30), config(device="cuda", precision="fp16", max_steps=2, log_every=1,
                                                        nan_policy="stop"), store, callbacks=[recorder])
    assert trainer.scaler.is_enabled()
    start = {n: t.detach().clone() for n, t in trainer.model.state_dict().items()}
    trainer.scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 24)
    trainer.train()
    scales = [m["train/loss_scale"] for _, m in recorder.logs]
    skipped_first = round(24 - math.log2(scales[0]))
    skipped = round(24 - math.log2(trainer.scaler.get_scale()))
    assert skipped_first >= 1
    usable = len(trainer.sampler.batches(0))
    assert trainer.epoch * usable + trainer.batch_in_epoch == 2 + skipped
    assert trainer.step == 2 and trainer.scheduler.last_epoch == 2
    assert {int(state["step"]) for state in trainer.optimizer.state.values()} == {2}
    assert [m["train/lr"] for _, m in recorder.logs] == [inverse_sqrt_lr(2, 32, 4), inverse_sqrt_lr(3, 32, 4)]
    # The first applied update is one update from the starting weights, at the scale that worked, on
    # the batch it ran on. A rate advanced by the skipped updates would make it (1 + skipped) times
    # larger (warm-up); up to GPU reduction order it is the same update.
    reference = Trainer(tiny_model(vocab_size=30), config(device="cuda", precision="fp16", max_steps=1), store)
    reference.scaler = torch.amp.GradScaler("cuda", init_scale=scales[0])
    reference.epoch, reference.batch_in_epoch = divmod(skipped_first, usable)
    reference.train()
    assert reference.scaler.get_scale() == scales[0]  # no overflow at that scale on that batch
    assert update_error(recorder.weights[0], reference.model.state_dict(), start) < 0.05


def tiny_with_dropout(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(build_config("tiny", 30, dropout=0.3, attention_dropout=0.1, activation_dropout=0.1))


def assert_same_training_state(a, b):
    """Two checkpoints of the same step: counters and RNG states equal, weights and Adam equal up to
    the GPU's reduction order (dropout masks drawn from another CUDA RNG state would differ far more)."""
    for key in ("step", "epoch", "batch_in_epoch"):
        assert a[key] == b[key], key
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == a["step"]
    assert torch.equal(a["rng_cpu"].cpu(), b["rng_cpu"].cpu())
    assert len(a["rng_cuda"]) == len(b["rng_cuda"]) == torch.cuda.device_count()
    for x, y in zip(a["rng_cuda"], b["rng_cuda"]):
        assert torch.equal(x.cpu(), y.cpu())
    for name in a["model"]:
        torch.testing.assert_close(a["model"][name], b["model"][name], rtol=1e-5, atol=1e-6, msg=name)
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(value, b["optimizer"]["state"][pid][key], rtol=1e-5, atol=1e-6)


def test_resume_on_cuda_is_exact(tmp_path):
    """14 steps straight equal 6 steps, a checkpoint, and 8 more steps from it in a new Trainer with
    other initial weights and another CUDA RNG state; dropout (0.3) runs on the GPU's generator."""
    store = write_token_store(tmp_path / "train", random_pairs(40, seed=1), vocab_size=30)
    settings = dict(device="cuda", checkpoint_every_steps=6, keep_checkpoints=10, seed=7, clip_norm=1.0)
    Trainer(tiny_with_dropout(123), config(max_steps=14, **settings), store, checkpoint_dir=tmp_path / "whole").train()
    Trainer(tiny_with_dropout(123), config(max_steps=6, **settings), store, checkpoint_dir=tmp_path / "resumed").train()
    torch.cuda.manual_seed_all(999)
    torch.rand(1000, device="cuda")
    resumed = Trainer(tiny_with_dropout(999), config(max_steps=14, **settings), store,
                      checkpoint_dir=tmp_path / "resumed")
    resumed.resume()
    assert resumed.step == 6 and resumed.model.output.weight.device.type == "cuda"
    resumed.train()
    assert_same_training_state(load_checkpoint(tmp_path / "whole" / "checkpoint_00000014.pt"),
                               load_checkpoint(tmp_path / "resumed" / "checkpoint_00000014.pt"))


def torchrun(store_path, checkpoint_dir, max_steps, every, resume=False):
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(NCCL_HELPER),
            str(store_path), str(checkpoint_dir), str(max_steps), str(every)] + (["--resume"] if resume else [])
    done = subprocess.run(args, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_nccl_available(),
                    reason="this torch build has no NCCL")
def test_torchrun_with_nccl_trains_and_resumes(tmp_path):
    store = write_token_store(tmp_path / "train", random_pairs(40, seed=1), vocab_size=30)
    whole = torchrun(store.path, tmp_path / "whole", 10, 5)
    assert whole["backend"] == "nccl" and whole["world_size"] == 1 and whole["all_reduce"] == 2.0
    assert whole["device"] == "cuda" and whole["step"] == 10
    stopped = torchrun(store.path, tmp_path / "resumed", 5, 5)
    assert stopped["step"] == 5
    resumed = torchrun(store.path, tmp_path / "resumed", 10, 5, resume=True)
    assert resumed == whole
    assert_same_training_state(load_checkpoint(tmp_path / "whole" / "checkpoint_00000010.pt"),
                               load_checkpoint(tmp_path / "resumed" / "checkpoint_00000010.pt"))


def test_resume_on_cuda(store, tmp_path):
    """resume() loads the checkpoint onto the GPU, RNG states included; torch.set_rng_state
    and torch.cuda.set_rng_state_all accept CPU byte tensors only."""
    cfg = dict(device="cuda", checkpoint_every_steps=2)
    Trainer(tiny_model(vocab_size=30), config(max_steps=2, **cfg), store, checkpoint_dir=tmp_path / "c").train()
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=4, **cfg), store, checkpoint_dir=tmp_path / "c")
    trainer.resume()
    assert trainer.step == 2
    trainer.train()
    assert trainer.step == 4


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_an_update_never_synchronizes_with_the_host(store, precision, monkeypatch):
    """One process on CUDA: inside an update nothing waits for the GPU (CUDA's sync debug mode
    raises on any synchronizing call: a read-back, a nonzero, a copy to the host); the host reads the
    device's ledger at log points only."""
    update = Trainer._update

    def strict(self, *args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return update(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(Trainer, "_update", strict)
    trainer = Trainer(tiny_model(vocab_size=30), config(device="cuda", precision=precision, max_steps=6, log_every=3),
                      store)
    trainer.train()
    assert trainer.step == 6
