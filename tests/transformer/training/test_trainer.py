"""transformer/training/trainer.py: learning, exact resume in a fresh process, checkpoints, limits."""

import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer.training.trainer as trainer_module
from transformer.checkpoint import CheckpointError, load_checkpoint, model_checkpoint, save_checkpoint
from transformer.search import greedy_search
from transformer.tokens import BOS_ID, PAD_ID
from transformer.training.batching import TokenBatchSampler, collate
from transformer.training.loss import label_smoothed_cross_entropy
from transformer.training.schedule import inverse_sqrt_lr
from transformer.training.token_store import write_token_store
from transformer.training.trainer import (
    NonFiniteLossError,
    OutOfMemoryError,
    TrainConfig,
    Trainer,
    TrainerCallback,
    list_checkpoints,
)

from ..conftest import pad_batch, tiny_model

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).resolve().with_name("trainer_run.py")


def random_pairs(n, vocab=30, max_len=8, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(4, vocab, size=rng.integers(1, max_len + 1)).tolist(),
             rng.integers(4, vocab, size=rng.integers(1, max_len + 1)).tolist()) for _ in range(n)]


@pytest.fixture
def store(tmp_path):
    return write_token_store(tmp_path / "train", random_pairs(40), vocab_size=30)


def config(**overrides):
    values = dict(max_tokens=60, warmup_steps=4, max_steps=3, checkpoint_every_steps=0, precision="fp32",
                  device="cpu", log_every=1000, pad_multiple=1)
    return TrainConfig(**{**values, **overrides})


class Recorder(TrainerCallback):
    def __init__(self):
        self.logs, self.checkpoints, self.validations, self.events = [], [], [], []

    def on_train_start(self, trainer):
        self.events.append("start")

    def on_log(self, step, metrics):
        self.logs.append((step, metrics))

    def on_validate(self, step, metrics):
        self.validations.append((step, metrics))

    def on_checkpoint(self, step, path):
        self.checkpoints.append((step, path))

    def on_train_end(self, trainer):
        self.events.append("end")

    def checkpoint_state(self):
        return {"run_id": "abc"}


# ------------------------------------------------------------------ learning
def test_tiny_model_learns_copy_task(copy_task):
    """Trainer + eq. 3 schedule + label smoothing: >= 99% token accuracy on held-out sentences."""
    model, sentences = copy_task.model, copy_task.held_out
    assert len(sentences) >= 190   # no timed assertion: the time is printed by the bench, not tested
    src = pad_batch(sentences)
    # Greedy decoding, a wrong length counting as errors on the missing/extra tokens.
    hypotheses = greedy_search(model, src).hypotheses
    correct = sum(sum(a == b for a, b in zip(h, s)) for h, s in zip(hypotheses, sentences))
    total = sum(max(len(h), len(s)) for h, s in zip(hypotheses, sentences))
    assert correct / total >= 0.99
    # Teacher-forced accuracy, EOS included.
    tgt_in = pad_batch([[BOS_ID, *s] for s in sentences], eos=False)
    tgt_out = pad_batch(sentences)
    with torch.no_grad():
        predicted = model(src, tgt_in).argmax(-1)
    real = tgt_out != PAD_ID
    assert float((predicted == tgt_out)[real].float().mean()) >= 0.99


# -------------------------------------------------------------------- resume
def run_helper(store_path, checkpoint_dir, max_steps, every, resume=False):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(HELPER), str(store_path), str(checkpoint_dir), str(max_steps), str(every)]
    done = subprocess.run(args + (["--resume"] if resume else []), env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.training
def test_resume_in_a_fresh_process_is_exact(tmp_path):
    n_steps, every = 14, 6
    store = write_token_store(tmp_path / "train", random_pairs(40, seed=1), vocab_size=30)
    n_batches = len(TokenBatchSampler(store.lengths["src"], store.lengths["tgt"], 60, seed=7,
                                      max_positions=256).batches(0))
    assert every % n_batches and n_steps > n_batches + every  # save mid-epoch, cross an epoch after it

    whole = run_helper(store.path, tmp_path / "whole", n_steps, every)
    stopped = run_helper(store.path, tmp_path / "resumed", every, every)
    assert stopped["step"] == every
    assert [p.name for p in list_checkpoints(tmp_path / "resumed")] == ["checkpoint_00000006.pt"]
    resumed = run_helper(store.path, tmp_path / "resumed", n_steps, every, resume=True)
    assert whole == resumed and whole["step"] == n_steps and whole["epoch"] >= 1

    a = load_checkpoint(tmp_path / "whole" / "checkpoint_00000014.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoint_00000014.pt")
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][pid][key]), (pid, key)
    assert torch.equal(a["rng_cpu"], b["rng_cpu"])
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == n_steps
    # The weights did move away from the step-6 checkpoint both runs share.
    mid = load_checkpoint(tmp_path / "whole" / "checkpoint_00000006.pt")["model"]
    assert not torch.equal(mid["output.weight"], a["model"]["output.weight"])


# ------------------------------------------------------- checkpoints, limits
def test_checkpoints_callbacks_and_logged_rate(store, tmp_path):
    recorder = Recorder()
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=7, checkpoint_every_steps=2, keep_checkpoints=2,
                                                        log_every=3),
                      store, checkpoint_dir=tmp_path / "ckpt", callbacks=[recorder])
    trainer.train()
    assert trainer.step == 7
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["checkpoint_00000006.pt",
                                                                    "checkpoint_00000007.pt"]
    assert [s for s, _ in recorder.checkpoints] == [2, 4, 6, 7]
    assert recorder.events == ["start", "end"]
    assert [s for s, _ in recorder.logs] == [3, 6, 7]
    step, metrics = recorder.logs[0]
    # After 3 updates the scheduler holds the rate of update 4.
    assert metrics["train/lr"] == pytest.approx(inverse_sqrt_lr(4, 32, 4), rel=1e-9)
    assert metrics["train/ppl"] == pytest.approx(math.exp(metrics["train/nll"]), rel=1e-6)
    assert metrics["train/loss"] > metrics["train/nll"] > 0  # label smoothing adds to the NLL
    ckpt = load_checkpoint(tmp_path / "ckpt" / "checkpoint_00000007.pt")
    assert ckpt["step"] == 7 and ckpt["callbacks"] == {"run_id": "abc"}
    assert ckpt["train_config"]["max_steps"] == 7


def test_regularizers_train_and_are_part_of_the_training(store, tmp_path):
    """Source word dropout, R-Drop and decoupled weight decay (regularizers.py): the training learns,
    its checkpoints hold the keys, a resume continues and another R-Drop weight starts over; a training
    without them keeps no such key (the checkpoints of before they existed)."""
    recorder = Recorder()
    on = dict(src_word_dropout=0.1, rdrop_alpha=5.0, weight_decay=0.01, checkpoint_every_steps=2, log_every=1)
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=4, **on), store, checkpoint_dir=tmp_path / "c",
                      callbacks=[recorder])
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    trainer.train()
    losses = [m["train/loss"] for _, m in recorder.logs]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    saved = load_checkpoint(tmp_path / "c" / "checkpoint_00000004.pt")
    assert saved["train_config"]["rdrop_alpha"] == 5.0 and saved["train_config"]["src_word_dropout"] == 0.1
    assert saved["fingerprint"]["train"]["rdrop_alpha"] == 5.0
    longer = Trainer(tiny_model(vocab_size=30), config(max_steps=6, **on), store, checkpoint_dir=tmp_path / "c")
    assert longer.resume() is not None and longer.step == 4
    other = Trainer(tiny_model(vocab_size=30), config(max_steps=6, **{**on, "rdrop_alpha": 1.0}), store,
                    checkpoint_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"train\.rdrop_alpha: 5\.0 -> 1\.0"):
        other.resume()
    Trainer(tiny_model(vocab_size=30), config(max_steps=2, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "plain").train()
    plain = load_checkpoint(tmp_path / "plain" / "checkpoint_00000002.pt")
    assert "rdrop_alpha" not in plain["train_config"] and "src_word_dropout" not in plain["fingerprint"]["train"]


def test_resume_rejects_another_model_config(store, tmp_path):
    Trainer(tiny_model(vocab_size=30), config(max_steps=2), store, checkpoint_dir=tmp_path / "c").train()
    other = Trainer(tiny_model(vocab_size=30, d_ff=48), config(max_steps=4), store, checkpoint_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"other settings \(model\.d_ff: 64 -> 48"):
        other.resume()
    assert Trainer(tiny_model(vocab_size=30), config(), store).resume() is None  # no checkpoint_dir


def test_resume_after_a_settings_change_restarts_or_continues(store, tmp_path):
    """A changed learning rate starts over (on_change="restart"); a raised step limit continues."""
    Trainer(tiny_model(vocab_size=30), config(max_steps=2), store, checkpoint_dir=tmp_path / "c").train()
    longer = Trainer(tiny_model(vocab_size=30), config(max_steps=4), store, checkpoint_dir=tmp_path / "c")
    assert longer.resume() is not None and longer.step == 2
    changed = Trainer(tiny_model(vocab_size=30), config(max_steps=4, lr_scale=2.0), store,
                      checkpoint_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"train\.lr_scale: 1\.0 -> 2\.0"):
        changed.resume()
    assert changed.resume(on_change="restart") is None and changed.step == 0
    assert list_checkpoints(tmp_path / "c") == []


def test_other_tokens_of_the_same_lengths_or_another_tokenizer_restart(store, tmp_path, capsys):
    """The fingerprint holds the token store's content, not only its sentence lengths, and the
    tokenizer's identity: a retokenized corpus whose sentences kept their lengths is another training."""
    Trainer(tiny_model(vocab_size=30), config(max_steps=2, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "c", tokenizer_sha256="a" * 64).train()
    same = Trainer(tiny_model(vocab_size=30), config(max_steps=4), store, checkpoint_dir=tmp_path / "c",
                   tokenizer_sha256="a" * 64)
    assert same.resume() is not None and same.step == 2
    shifted = [([4 + (i - 3) % 26 for i in src], tgt) for src, tgt in random_pairs(40)]   # every length kept
    other = write_token_store(tmp_path / "retokenized", shifted, vocab_size=30)
    assert all(np.array_equal(other.lengths[side], store.lengths[side]) for side in ("src", "tgt"))
    retokenized = Trainer(tiny_model(vocab_size=30), config(max_steps=4), other, checkpoint_dir=tmp_path / "c",
                          tokenizer_sha256="a" * 64)
    with pytest.raises(ValueError, match=r"other settings \(data: '40:[0-9a-f]{64}' -> '40:[0-9a-f]{64}'\)"):
        retokenized.resume()
    capsys.readouterr()
    assert retokenized.resume(on_change="restart") is None and retokenized.step == 0
    assert capsys.readouterr().out.startswith("the training data changed since ")
    Trainer(tiny_model(vocab_size=30), config(max_steps=2, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "d", tokenizer_sha256="a" * 64).train()
    vocabulary = Trainer(tiny_model(vocab_size=30), config(max_steps=4), store, checkpoint_dir=tmp_path / "d",
                         tokenizer_sha256="b" * 64)
    assert vocabulary.resume(on_change="restart") is None and vocabulary.step == 0
    line = capsys.readouterr().out
    assert line.startswith("the tokenizer changed since ") and line.count("\n") == 1, line


def test_cooldown_resumes_where_the_updates_made_had_its_rates(store, tmp_path):
    """A cool-down (the last ``cooldown_steps`` of ``max_steps``) continues a checkpoint made before it
    starts, to the weights of a cooled training from scratch; after it, a raised limit cannot continue."""
    Trainer(tiny_model(vocab_size=30), config(max_steps=4, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "c").train()
    cooled = Trainer(tiny_model(vocab_size=30), config(max_steps=8, cooldown_steps=4, checkpoint_every_steps=2),
                     store, checkpoint_dir=tmp_path / "c")
    assert cooled.resume() is not None and cooled.step == 4   # updates 1-4 had eq. 3's rates in both
    cooled.train()
    assert cooled.step == 8
    assert cooled.scheduler.get_last_lr()[0] == pytest.approx(inverse_sqrt_lr(9, 32, 4) / 4, rel=1e-12)
    straight = Trainer(tiny_model(vocab_size=30), config(max_steps=8, cooldown_steps=4), store)
    straight.train()
    for a, b in zip(cooled.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    eq3_only = Trainer(tiny_model(vocab_size=30), config(max_steps=8), store)
    eq3_only.train()
    assert not torch.equal(eq3_only.model.output.weight, straight.model.output.weight)
    longer = Trainer(tiny_model(vocab_size=30), config(max_steps=12, cooldown_steps=4), store,
                     checkpoint_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"train\.\(max_steps, cooldown_steps\): \(8, 4\) -> \(12, 4\)"):
        longer.resume()


# ---------------------------------------------------------------- init_from
def save_init(path, seed, **overrides):
    save_checkpoint(path, model_checkpoint(tiny_model(vocab_size=30, seed=seed, **overrides),
                                           callbacks={"run_id": "the-champion's-run"}))
    return path


def test_init_from_starts_from_the_weights_with_a_fresh_optimizer(store, tmp_path):
    """Fine-tuning: the model starts as the init file's, step 0, no Adam state, warm-up from the start."""
    init = save_init(tmp_path / "init.pt", seed=3)
    recorder = Recorder()
    trainer = Trainer(tiny_model(vocab_size=30, seed=0), config(init_from=str(init), max_steps=1, log_every=1), store,
                      callbacks=[recorder])
    expected = load_checkpoint(init)["model"]
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert trainer.step == 0 and trainer.optimizer.state_dict()["state"] == {}
    assert trainer.init_sha256 == hashlib.sha256(init.read_bytes()).hexdigest()
    assert trainer.fingerprint()["init"] == trainer.init_sha256
    assert "init" not in Trainer(tiny_model(vocab_size=30), config(), store).fingerprint()
    trainer.train()
    scratch = Recorder()
    Trainer(tiny_model(vocab_size=30), config(max_steps=1, log_every=1), store, callbacks=[scratch]).train()
    assert recorder.logs[0][1]["train/lr"] == scratch.logs[0][1]["train/lr"]   # eq. 3 from its first step
    assert trainer.state_dict()["callbacks"] == {"run_id": "abc"}              # not the init file's


def test_another_init_file_restarts_training_the_same_bytes_resume(store, tmp_path):
    init_a, init_b = save_init(tmp_path / "a.pt", seed=3), save_init(tmp_path / "b.pt", seed=4)
    Trainer(tiny_model(vocab_size=30), config(init_from=str(init_a), max_steps=2, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "c").train()
    # The same bytes under another path: a resume.
    moved = tmp_path / "moved" / "a.pt"
    moved.parent.mkdir()
    moved.write_bytes(init_a.read_bytes())
    again = Trainer(tiny_model(vocab_size=30), config(init_from=str(moved), max_steps=4), store,
                    checkpoint_dir=tmp_path / "c")
    assert again.resume() is not None and again.step == 2
    # Other bytes: the old checkpoints are another training.
    other = Trainer(tiny_model(vocab_size=30), config(init_from=str(init_b), max_steps=4), store,
                    checkpoint_dir=tmp_path / "c")
    with pytest.raises(ValueError, match=r"other settings \(init: '[0-9a-f]{64}' -> '[0-9a-f]{64}'\)"):
        other.resume()
    assert other.resume(on_change="restart") is None and other.step == 0
    assert torch.equal(other.model.output.weight, load_checkpoint(init_b)["model"]["output.weight"])
    # From scratch after a fine-tuning: a restart too.
    Trainer(tiny_model(vocab_size=30), config(init_from=str(init_b), max_steps=2, checkpoint_every_steps=2), store,
            checkpoint_dir=tmp_path / "d").train()
    scratch = Trainer(tiny_model(vocab_size=30), config(max_steps=4), store, checkpoint_dir=tmp_path / "d")
    with pytest.raises(ValueError, match=r"init: '[0-9a-f]{64}' -> None"):
        scratch.resume()


def test_init_from_another_model_config_is_one_clear_error(store, tmp_path):
    init = save_init(tmp_path / "init.pt", seed=3, d_ff=48)
    with pytest.raises(CheckpointError) as err:
        Trainer(tiny_model(vocab_size=30), config(init_from=str(init)), store)
    assert str(err.value) == (f"TrainConfig.init_from: {init} was trained with another model config: "
                              "d_ff 48 (this model: 64)")
    with pytest.raises(CheckpointError, match=r"TrainConfig.init_from: .*missing.pt does not exist"):
        Trainer(tiny_model(vocab_size=30), config(init_from=str(tmp_path / "missing.pt")), store)
    with pytest.raises(ValueError, match="TrainConfig.init_from must be a path"):
        config(init_from=3)


def test_max_epochs_and_validation(store, tmp_path):
    valid = write_token_store(tmp_path / "valid", random_pairs(10, seed=5), vocab_size=30)
    recorder = Recorder()
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=0, max_epochs=2), store, valid_data=valid,
                      callbacks=[recorder])
    n_batches = len(trainer.sampler.batches(0))
    trainer.train()
    assert trainer.epoch == 2 and trainer.step == len(trainer.sampler.batches(1)) + n_batches
    assert [s for s, _ in recorder.validations] == [n_batches, trainer.step]  # at each epoch's end
    metrics = trainer.evaluate_loss(valid)
    # evaluate_loss is the token-weighted mean of the label-smoothed loss over the valid set.
    loss = nll = tokens = 0.0
    trainer.model.eval()
    with torch.no_grad():
        for i in range(len(valid)):
            batch = collate(valid, [i])
            out = label_smoothed_cross_entropy(trainer.model(batch.src, batch.tgt_in), batch.tgt_out, PAD_ID, 0.1)
            loss, nll, tokens = loss + float(out.loss), nll + float(out.nll), tokens + int(out.n_tokens)
    assert metrics["valid/loss"] == pytest.approx(loss / tokens, rel=1e-4)
    assert metrics["valid/nll"] == pytest.approx(nll / tokens, rel=1e-4)
    assert metrics["valid/ppl"] == pytest.approx(math.exp(nll / tokens), rel=1e-4)


def test_resume_at_an_epoch_end_does_not_validate_that_step_again(store, tmp_path):
    """Raising max_epochs after a finished run resumes from its last checkpoint, made after the
    epoch's validation: the next validation is the next epoch's, and the returned metrics of a
    run resumed with nothing left to do are the checkpoint's."""
    valid = write_token_store(tmp_path / "valid", random_pairs(10, seed=5), vocab_size=30)
    first = Trainer(tiny_model(vocab_size=30), config(max_steps=0, max_epochs=1), store, valid_data=valid,
                    checkpoint_dir=tmp_path / "c")
    first_metrics = first.train()
    recorder = Recorder()
    again = Trainer(tiny_model(vocab_size=30), config(max_steps=0, max_epochs=1), store, valid_data=valid,
                    checkpoint_dir=tmp_path / "c", callbacks=[recorder])
    again.resume()
    assert again.train() == first_metrics and recorder.validations == []
    longer = Trainer(tiny_model(vocab_size=30), config(max_steps=0, max_epochs=2), store, valid_data=valid,
                     checkpoint_dir=tmp_path / "c", callbacks=[recorder])
    longer.resume()
    longer.train()
    assert [s for s, _ in recorder.validations] == [longer.step] and longer.step > first.step


READ_BACKS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@contextlib.contextmanager
def counting_read_backs(where):
    """Count the calls of the tensor methods that copy a value to the host, by ``where()`` at the call."""
    calls = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READ_BACKS}

    def counted(name, original):
        def method(self, *args, **kwargs):
            calls[where()] += 1
            return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("precision,regularizers", [
    ("fp32", {}), ("bf16", {}), ("bf16", {"src_word_dropout": 0.1, "rdrop_alpha": 5.0, "weight_decay": 0.01})])
def test_an_update_reads_nothing_back_from_the_device(store, precision, regularizers, monkeypatch):
    """One process: an update reads nothing back (the skip decision, the rate, the logged sums stay
    on the device); the host reads at log points, so the reads do not grow with the updates between."""
    in_update = []
    update = Trainer._update

    def watched(self, *args, **kwargs):
        in_update.append(True)
        try:
            return update(self, *args, **kwargs)
        finally:
            in_update.pop()

    monkeypatch.setattr(Trainer, "_update", watched)

    def reads(max_steps, log_every):
        trainer = Trainer(tiny_model(vocab_size=30), config(precision=precision, max_steps=max_steps,
                                                            log_every=log_every, **regularizers),
                          store, callbacks=[Recorder()])
        with counting_read_backs(lambda: "update" if in_update else "host") as calls:
            trainer.train()
        return trainer, calls

    short, short_calls = reads(max_steps=12, log_every=4)
    long, long_calls = reads(max_steps=24, log_every=8)
    assert short.step == 12 and long.step == 24
    assert short_calls["update"] == long_calls["update"] == 0
    assert short_calls["host"] == long_calls["host"] > 0   # 3 log points each


def test_non_finite_loss(store):
    model = tiny_model(vocab_size=30)
    with torch.no_grad():
        model.encoder_layers[0].ffn.linear1.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 1"):
        Trainer(model, config(nan_policy="stop"), store).train()
    trainer = Trainer(model, config(max_steps=0, max_epochs=1, nan_policy="skip"), store)
    trainer.train()
    assert trainer.step == 0 and trainer.epoch == 1  # every update skipped, none applied
    assert trainer.skipped_updates == len(trainer.sampler.batches(0)) and trainer.scheduler.last_epoch == 0
    assert all(int(state["step"]) == 0 for state in trainer.optimizer.state.values())


def test_non_finite_updates_between_log_points(store, capsys):
    """A non-finite update among good ones: skipped on the device (the step, the rate and Adam's
    count do not move) and counted; with nan_policy "stop" the run stops at the next log point and
    names the update's step."""
    def poisoned(policy):
        trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=6, log_every=3, nan_policy=policy), store,
                          callbacks=[Recorder()])
        update = trainer._update
        calls = []

        def update_poisoning_the_second(group, *args, **kwargs):
            calls.append(group)
            if len(calls) == 2:
                with torch.no_grad():
                    saved = trainer.model.encoder_layers[0].ffn.linear1.weight[0, 0].clone()
                    trainer.model.encoder_layers[0].ffn.linear1.weight[0, 0] = float("nan")
                update(group, *args, **kwargs)
                with torch.no_grad():
                    trainer.model.encoder_layers[0].ffn.linear1.weight[0, 0] = saved
                return
            update(group, *args, **kwargs)

        trainer._update = update_poisoning_the_second
        return trainer, calls

    trainer, calls = poisoned("skip")
    trainer.train()
    assert trainer.step == 6 and len(calls) == 7 and trainer.skipped_updates == 1
    assert trainer.scheduler.last_epoch == 6
    assert {int(state["step"]) for state in trainer.optimizer.state.values()} == {6}
    assert [s for s, _ in trainer.callbacks[0].logs] == [3, 6]
    assert [m["train/lr"] for _, m in trainer.callbacks[0].logs] == [inverse_sqrt_lr(n, 32, 4) for n in (4, 7)]
    assert "1 update(s) with a non-finite loss skipped since step 1" in capsys.readouterr().out
    trainer, calls = poisoned("stop")
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 2;"):
        trainer.train()
    assert len(calls) == 3 and trainer.callbacks[0].logs == []   # stopped at the first log point


# ------------------------------------------------------- fp16 loss scaling
def with_fp16_scaler(trainer, init_scale):
    """fp16 autocast and a real loss scaler on CPU (torch.amp.GradScaler("cpu")). The Trainer refuses
    fp16 on CPU (slow, and no GPU-free user wants it) and builds its scaler for CUDA, so the test sets
    both after construction; the code path is the one fp16 training on a GPU runs."""
    trainer.config = dataclasses.replace(trainer.config, precision="fp16")
    trainer.precision = "fp16"
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return trainer


class WeightsAtLog(Recorder):
    def on_train_start(self, trainer):
        super().on_train_start(trainer)
        self.trainer, self.weights = trainer, []

    def on_log(self, step, metrics):
        super().on_log(step, metrics)
        self.weights.append({k: v.clone() for k, v in self.trainer.model.state_dict().items()})


def test_overflowing_fp16_updates_are_skipped_without_advancing_the_schedule(store):
    """A loss scale of 2^24 overflows fp16 gradients: the scaler skips those updates and halves its
    scale until they fit. A skipped update consumes its batch but moves neither the weights, nor
    Adam's state, nor the step count, nor the learning rate (update n runs at eq. 3's rate of step n),
    and it is not a non-finite loss (nan_policy "stop" does not fire)."""
    recorder = WeightsAtLog()
    trainer = with_fp16_scaler(Trainer(tiny_model(vocab_size=30), config(max_steps=2, log_every=1, nan_policy="stop"),
                                       store, callbacks=[recorder]), 2.0 ** 24)
    trainer.train()
    scales = [m["train/loss_scale"] for _, m in recorder.logs]
    skipped_first = round(24 - math.log2(scales[0]))       # overflows before the first applied update
    skipped = round(24 - math.log2(trainer.scaler.get_scale()))
    assert skipped_first >= 1 and scales[1] <= scales[0]
    usable = len(trainer.sampler.batches(0))
    assert trainer.epoch * usable + trainer.batch_in_epoch == 2 + skipped  # every batch consumed once
    assert trainer.step == 2 and trainer.scheduler.last_epoch == 2
    assert {int(state["step"]) for state in trainer.optimizer.state.values()} == {2}
    assert [s for s, _ in recorder.logs] == [1, 2]
    assert [m["train/lr"] for _, m in recorder.logs] == [inverse_sqrt_lr(2, 32, 4), inverse_sqrt_lr(3, 32, 4)]
    # The first applied update equals one update from the same weights at the scale that worked, on the
    # batch it ran on: the skipped updates before it left no trace (weights, Adam moments, schedule).
    reference = with_fp16_scaler(Trainer(tiny_model(vocab_size=30), config(max_steps=1), store), scales[0])
    reference.epoch, reference.batch_in_epoch = divmod(skipped_first, usable)
    reference.train()
    assert round(math.log2(reference.scaler.get_scale())) == round(math.log2(scales[0]))  # no overflow there
    for name, tensor in reference.model.state_dict().items():
        assert torch.equal(recorder.weights[0][name], tensor), name


def test_stop_request_ends_training(store):
    class StopAtTwo(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_train_start(self, trainer):
            self.trainer = trainer

        def on_log(self, step, metrics):
            if step == 2:
                self.trainer.stop_requested = True

    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=50, log_every=1), store, callbacks=[StopAtTwo()])
    trainer.train()
    assert trainer.step == 2


def test_sigterm_saves_a_checkpoint_and_a_resume_trains_on_to_the_same_weights(store, tmp_path):
    """SIGTERM (as from `kill`, a scheduler or Ctrl-C's SIGINT) stops at the end of the current update
    with a checkpoint; a new trainer resumes from it and ends with the weights of an uninterrupted run."""
    import signal

    class TermAtTwo(TrainerCallback):
        def on_log(self, step, metrics):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)

    cfg = config(max_steps=5, log_every=1, checkpoint_every_steps=100)
    stopped = Trainer(tiny_model(vocab_size=30), cfg, store, checkpoint_dir=tmp_path / "c", callbacks=[TermAtTwo()])
    stopped.train()
    # A resume point, off the checkpoint grid: never kept or averaged (list_checkpoints leaves it out).
    assert stopped.step == 2 and stopped.stopped_early and list_checkpoints(tmp_path / "c") == []
    assert [p.name for p in list_checkpoints(tmp_path / "c", resume_points=True)] == ["checkpoint_00000002.resume.pt"]
    assert signal.getsignal(signal.SIGTERM) is not stopped._request_stop   # the handler is restored
    resumed = Trainer(tiny_model(vocab_size=30), cfg, store, checkpoint_dir=tmp_path / "c")
    assert resumed.resume() is not None and resumed.step == 2 and not resumed.stop_requested
    resumed.train()
    assert resumed.step == 5
    straight = Trainer(tiny_model(vocab_size=30), cfg, store, checkpoint_dir=tmp_path / "straight")
    straight.train()
    for a, b in zip(resumed.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("field,value,message", [
    ("max_tokens", 0, "TrainConfig.max_tokens must be a positive integer"),
    ("update_freq", 1.5, "TrainConfig.update_freq must be a positive integer"),
    ("max_steps", -1, "TrainConfig.max_steps must be a non-negative integer"),
    ("cooldown_steps", -2, "TrainConfig.cooldown_steps must be a non-negative integer"),
    ("cooldown_steps", 5, r"TrainConfig.cooldown_steps \(5\) must be at most max_steps \(3\)"),
    ("lr_scale", -1.0, "TrainConfig.lr_scale must be a non-negative number"),
    ("label_smoothing", 1.0, r"TrainConfig.label_smoothing must be in \[0, 1\)"),
    ("nan_policy", "ignore", "TrainConfig.nan_policy"),
    ("device", "tpu", "TrainConfig.device"),
])
def test_train_config_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        config(**{field: value})


def test_train_config_needs_a_limit_and_known_keys():
    with pytest.raises(ValueError,
                       match="TrainConfig.max_steps, TrainConfig.max_epochs and TrainConfig.max_minutes are all 0"):
        TrainConfig()
    with pytest.raises(ValueError, match="unknown TrainConfig field.*epochs"):
        TrainConfig.from_dict({"epochs": 3})
    assert TrainConfig.from_dict({"max_steps": 5}).max_steps == 5


def test_fp16_on_cpu_is_refused(store):
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        Trainer(tiny_model(vocab_size=30), config(precision="fp16"), store)


def test_out_of_memory_names_the_batch_and_the_knob(store, monkeypatch):
    trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=2), store)

    def too_big(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer, "forward_model", too_big)
    with pytest.raises(OutOfMemoryError, match=r"out of memory on a batch of \d+ sentences x \d+ tokens "
                                               r"\(TrainConfig.max_tokens=\d+\): lower TrainConfig.max_tokens"):
        trainer.train()
    assert trainer.step == 0


def test_prefetched_batches_train_as_batches_collated_in_the_loop(store, tmp_path, monkeypatch):
    """The batches are collated on the prefetch thread, and the training's checkpoints are byte for
    byte those of a loop that collates in line (prefetch=0): the same batches in the same order."""
    threads = set()
    real_collate = trainer_module.collate

    def collate(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real_collate(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "collate", collate)
    digests = {}
    for prefetch in (0, 2):
        threads.clear()
        torch.manual_seed(0)
        trainer = Trainer(tiny_model(vocab_size=30), config(max_steps=0, max_epochs=3, checkpoint_every_steps=4),
                          store, checkpoint_dir=tmp_path / str(prefetch), prefetch=prefetch)
        trainer.train()
        digests[prefetch] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                             for p in (tmp_path / str(prefetch)).iterdir()}
        assert threads == ({"MainThread"} if prefetch == 0 else {"batch-prefetch"})
    assert len(digests[0]) >= 2 and digests[0] == digests[2]
