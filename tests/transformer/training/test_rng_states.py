"""transformer/training/rng_states.py: each rank's generators in the checkpoint rank 0 writes. One process
writes none of them (its checkpoints keep their bytes: ``rng_cpu``/``rng_cuda`` only); a state with
one entry per rank gives each rank its own; any other (older checkpoints, another number of
processes) gives every rank rank 0's. Two real ranks: test_trainer_distributed_stop.py."""

from __future__ import annotations

import pytest
import torch

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training import rng_states
from transformer.training.token_store import TokenStore, write_token_store
from transformer.training.trainer import TrainConfig, Trainer

from .test_trainer_distributed import pairs

pytestmark = pytest.mark.fast


def states(*seeds: int) -> list[torch.Tensor]:
    out = []
    for seed in seeds:
        torch.manual_seed(seed)
        out.append(torch.get_rng_state())
    return out


def test_one_process_saves_no_per_rank_states(tmp_path):
    assert rng_states.gather(1) is None
    store = write_token_store(tmp_path / "store", pairs(), vocab_size=40)
    trainer = Trainer(Transformer(build_config("tiny", 40)), TrainConfig(max_steps=2, max_tokens=48, device="cpu",
                      precision="fp32"), TokenStore(store.path), checkpoint_dir=tmp_path / "ck")
    state = trainer.state_dict()
    assert "rng_ranks" not in state and torch.equal(state["rng_cpu"], torch.get_rng_state())


def test_each_rank_restores_its_own_states_when_there_is_one_per_rank():
    rank0, rank1, rank2 = states(1, 2, 3)
    state = {"rng_cpu": rank0, "rng_cuda": [],
             "rng_ranks": [{"cpu": rank0, "cuda": []}, {"cpu": rank1, "cuda": []}]}
    rng_states.restore(state, rank=1, world_size=2)
    assert torch.equal(torch.get_rng_state(), rank1)
    rng_states.restore(state, rank=0, world_size=2)
    assert torch.equal(torch.get_rng_state(), rank0)
    # Another number of processes (never resumed by Trainer.resume: world_size is in the
    # fingerprint), or a checkpoint from before rng_ranks: rank 0's states for every rank.
    three = {**state, "rng_ranks": [*state["rng_ranks"], {"cpu": rank2, "cuda": []}]}
    rng_states.restore(three, rank=1, world_size=2)
    assert torch.equal(torch.get_rng_state(), rank0)
    rng_states.restore({"rng_cpu": rank2, "rng_cuda": []}, rank=1, world_size=2)
    assert torch.equal(torch.get_rng_state(), rank2)
