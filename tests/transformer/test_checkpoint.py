"""transformer/checkpoint.py: averaging (§6.1), safe loading, atomic writes."""

import os

import pytest
import torch

from transformer.checkpoint import (
    CheckpointError,
    atomic_write,
    average_checkpoints,
    file_sha256,
    init_weights,
    load_checkpoint,
    load_model,
    load_state,
    model_checkpoint,
    save_checkpoint,
)
from transformer.tokens import BOS_ID

from .conftest import pad_batch, tiny_model

pytestmark = pytest.mark.fast


class Payload:
    """An arbitrary class: unpickling it would need code execution, which weights_only refuses."""

    def __init__(self, value):
        self.value = value


def write_three(tmp_path):
    paths = []
    for seed in range(3):
        path = tmp_path / f"checkpoint_{seed}.pt"
        save_checkpoint(path, model_checkpoint(tiny_model(seed=seed), step=seed))
        paths.append(path)
    return paths


def test_average_equals_parameter_mean(tmp_path):
    paths = write_three(tmp_path)
    states = [load_checkpoint(p)["model"] for p in paths]
    assert not torch.equal(states[0]["encoder_layers.0.self_attn.in_proj.weight"],
                           states[1]["encoder_layers.0.self_attn.in_proj.weight"])
    averaged = average_checkpoints(paths)
    assert averaged["model_config"] == tiny_model().config.to_dict()
    assert averaged["averaged_from"] == [str(p) for p in paths]
    assert set(averaged["model"]) == set(states[0])
    for name, tensor in averaged["model"].items():
        assert tensor.dtype == states[0][name].dtype
        exact = ((states[0][name].double() + states[1][name].double() + states[2][name].double()) / 3).float()
        assert torch.equal(tensor, exact), name
        assert torch.allclose(tensor, torch.stack([s[name] for s in states]).mean(0), atol=1e-7), name

    # The averaged checkpoint loads into a model whose parameters are that mean.
    path = tmp_path / "averaged.pt"
    save_checkpoint(path, averaged)
    model = load_model(path)
    w = model.decoder_layers[1].ffn.linear2.weight.detach()
    mean = sum(s["decoder_layers.1.ffn.linear2.weight"] for s in states) / 3
    assert torch.allclose(w, mean, atol=1e-7)


def test_average_of_one_is_identity(tmp_path):
    paths = write_three(tmp_path)
    one = average_checkpoints(paths[:1])
    state = load_checkpoint(paths[0])["model"]
    assert all(torch.equal(one["model"][k], state[k]) for k in state)


def test_average_rejects_mismatched_configs(tmp_path):
    paths = write_three(tmp_path)
    other = tmp_path / "other.pt"
    save_checkpoint(other, model_checkpoint(tiny_model(d_ff=48)))
    with pytest.raises(CheckpointError, match="different model config"):
        average_checkpoints([paths[0], paths[1], other])
    same_shapes = tmp_path / "gelu.pt"  # same tensor shapes, different config
    save_checkpoint(same_shapes, model_checkpoint(tiny_model(activation="gelu")))
    with pytest.raises(CheckpointError, match="different model config"):
        average_checkpoints([paths[0], same_shapes])
    with pytest.raises(CheckpointError, match="no checkpoints"):
        average_checkpoints([])


def test_load_refuses_pickled_objects(tmp_path):
    path = tmp_path / "evil.pt"
    save_checkpoint(path, {"model": {}, "payload": Payload(3)})
    assert os.path.getsize(path) > 0
    # The file is a valid pickle (unsafe loading would return the object) ...
    assert torch.load(path, weights_only=False)["payload"].value == 3
    # ... but load_checkpoint uses weights_only=True and refuses it.
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        load_checkpoint(path)


def test_load_plain_checkpoint_and_missing_file(tmp_path):
    path = tmp_path / "plain.pt"
    save_checkpoint(path, {"step": 7, "values": [1.5, "a"], "t": torch.arange(3), "nested": {"x": 1}})
    ckpt = load_checkpoint(path)
    assert ckpt["step"] == 7 and ckpt["values"] == [1.5, "a"] and ckpt["nested"] == {"x": 1}
    assert torch.equal(ckpt["t"], torch.arange(3))
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError):
        load_checkpoint(garbage)


def test_atomic_write_keeps_old_file_when_writer_raises(tmp_path):
    path = tmp_path / "file.bin"
    atomic_write(path, lambda f: f.write(b"old contents"))
    assert path.read_bytes() == b"old contents"

    def failing(f):
        f.write(b"half of the new")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, failing)
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]  # no temporary file left

    atomic_write(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


def test_atomic_write_creates_parent_and_no_file_on_failure(tmp_path):
    path = tmp_path / "a" / "b" / "c.bin"
    with pytest.raises(ValueError):
        atomic_write(path, lambda f: (_ for _ in ()).throw(ValueError("boom")))
    assert not path.exists() and list(path.parent.iterdir()) == []


def test_load_model_round_trip(tmp_path):
    model = tiny_model(seed=5, norm_first=True)
    path = tmp_path / "m.pt"
    save_checkpoint(path, model_checkpoint(model, step=12))
    assert load_checkpoint(path)["step"] == 12
    loaded = load_model(path).eval()
    assert loaded.config == model.config
    src = pad_batch([[5, 6, 7]])
    tgt = torch.tensor([[BOS_ID, 5]])
    with torch.no_grad():
        assert torch.equal(loaded(src, tgt), model(src, tgt))
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.output.weight is loaded.tgt_embed.tokens.weight  # tying survives loading


def test_load_model_rejects_incomplete_checkpoint(tmp_path):
    path = tmp_path / "x.pt"
    save_checkpoint(path, {"model": {}})
    with pytest.raises(CheckpointError, match="no model_config/model"):
        load_model(path)


def test_load_state_names_the_mismatch():
    model = tiny_model()
    state = tiny_model().state_dict()
    state["output.weight"] = torch.zeros(25, 32)
    with pytest.raises(CheckpointError, match=r"output\.weight has shape \(25, 32\)"):
        load_state(model, state)
    state = tiny_model().state_dict()
    del state["encoder_layers.0.ffn.linear1.bias"]
    with pytest.raises(CheckpointError, match="missing.*encoder_layers.0.ffn.linear1.bias"):
        load_state(model, state)


def test_init_weights_copies_the_weights_and_returns_the_file_hash(tmp_path):
    import hashlib

    source = tiny_model(seed=3)
    path = tmp_path / "init.pt"
    save_checkpoint(path, model_checkpoint(source, callbacks={"mlflow_run_id": "someone-elses-run"}))
    model = tiny_model(seed=0)
    assert not torch.equal(model.output.weight, source.output.weight)
    assert init_weights(model, path) == hashlib.sha256(path.read_bytes()).hexdigest() == file_sha256(path)
    for (name, a), b in zip(source.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    assert model.output.weight is model.tgt_embed.tokens.weight  # tying survives


def test_init_weights_names_every_config_difference(tmp_path):
    path = tmp_path / "init.pt"
    save_checkpoint(path, model_checkpoint(tiny_model(vocab_size=24, d_ff=48)))
    model = tiny_model(vocab_size=30)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as err:
        init_weights(model, path)
    message = str(err.value)
    assert message.startswith(f"{path} was trained with another model config: ")
    assert "vocab_size 24 (this model: 30)" in message and "d_ff 48 (this model: 64)" in message
    assert "another tokenizer" in message and "\n" not in message
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    save_checkpoint(path, {"step": 3})
    with pytest.raises(CheckpointError, match="no model_config/model entries"):
        init_weights(model, path)
    with pytest.raises(CheckpointError, match="does not exist"):
        init_weights(model, tmp_path / "missing.pt")
