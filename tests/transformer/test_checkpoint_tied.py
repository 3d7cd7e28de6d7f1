"""transformer/checkpoint.py: the averaged model (§6.1) stores the tied matrix of §3.4 once, as a
training checkpoint does, and gets the sharing back on load; averaged files written before (one
copy per key) still load and average."""

from __future__ import annotations

import pytest
import torch

from transformer.checkpoint import (
    CheckpointError,
    average_checkpoints,
    load_checkpoint,
    load_model,
    model_checkpoint,
    save_checkpoint,
    tied_names,
)

from .conftest import tiny_model

pytestmark = pytest.mark.fast

VOCAB = 1000   # the embedding dominates the file: 1000 x 32 float32 = 128 KB


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.fixture
def checkpoints(tmp_path):
    paths = []
    for seed in range(3):
        paths.append(tmp_path / f"checkpoint_{seed}.pt")
        save_checkpoint(paths[-1], model_checkpoint(tiny_model(vocab_size=VOCAB, seed=seed)))
    return paths


def old_format(averaged: dict) -> dict:
    """An averaged model as average_checkpoints wrote it before: a separate tensor per key."""
    return {**averaged, "model": {name: tensor.clone() for name, tensor in averaged["model"].items()}}


def test_tied_names_follow_the_model_config():
    shared = tied_names(tiny_model(vocab_size=VOCAB).config)
    assert shared["tgt_embed.tokens.weight"] == shared["output.weight"] == "src_embed.tokens.weight"
    apart = tied_names(tiny_model(vocab_size=VOCAB, share_embeddings=False).config)
    assert apart["src_embed.tokens.weight"] == "src_embed.tokens.weight"
    assert apart["output.weight"] == "tgt_embed.tokens.weight"


def test_the_averaged_model_stores_the_tied_matrix_once(checkpoints, tmp_path):
    averaged = average_checkpoints(checkpoints)
    save_checkpoint(tmp_path / "model.pt", averaged)
    save_checkpoint(tmp_path / "old.pt", old_format(averaged))
    matrix = averaged["model"]["output.weight"]
    saved = (tmp_path / "old.pt").stat().st_size - (tmp_path / "model.pt").stat().st_size
    # Two copies of the embedding fewer, give or take the zip's per-record overhead.
    assert 2 * matrix.nbytes <= saved <= 2 * matrix.nbytes + 4096, (saved, matrix.nbytes)

    loaded = load_checkpoint(tmp_path / "model.pt")["model"]
    names = ("src_embed.tokens.weight", "tgt_embed.tokens.weight", "output.weight")
    assert all(same_storage(loaded[names[0]], loaded[name]) for name in names)   # sharing restored
    for name, tensor in averaged["model"].items():
        assert torch.equal(loaded[name], tensor), name
    # The element-wise mean of the three models, the tied matrix included.
    mean = sum(tiny_model(vocab_size=VOCAB, seed=s).state_dict()["output.weight"].double() for s in range(3)) / 3
    assert torch.equal(loaded["output.weight"], mean.float())
    model = load_model(tmp_path / "model.pt")
    assert model.output.weight is model.tgt_embed.tokens.weight is model.src_embed.tokens.weight
    assert torch.equal(model.output.weight, mean.float())


def test_an_averaged_file_of_the_old_format_still_loads_and_averages(checkpoints, tmp_path):
    averaged = average_checkpoints(checkpoints)
    save_checkpoint(tmp_path / "old.pt", old_format(averaged))
    loaded = load_checkpoint(tmp_path / "old.pt")["model"]
    assert not same_storage(loaded["output.weight"], loaded["src_embed.tokens.weight"])   # three copies
    model = load_model(tmp_path / "old.pt")
    assert model.output.weight is model.src_embed.tokens.weight
    for name, tensor in averaged["model"].items():
        assert torch.equal(model.state_dict()[name], tensor), name
    again = average_checkpoints([tmp_path / "old.pt"])["model"]   # copies checked equal, averaged once
    assert same_storage(again["output.weight"], again["src_embed.tokens.weight"])
    assert torch.equal(again["output.weight"], averaged["model"]["output.weight"])

    broken = old_format(averaged)
    broken["model"]["output.weight"][0, 0] += 1.0   # a copy that no longer equals the matrix it is tied to
    save_checkpoint(tmp_path / "broken.pt", broken)
    with pytest.raises(CheckpointError, match="output.weight differs from src_embed.tokens.weight"):
        average_checkpoints([tmp_path / "broken.pt"])
