"""transformer/training/trainer.py under torch.distributed: two gloo processes on CPU end with the same
parameters as one process that accumulates the same two batches per update (§5.2's batching)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import write_token_store
from transformer.training.trainer import TrainConfig, Trainer

pytestmark = pytest.mark.training

STEPS = 6


def pairs():
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(96):
        n = int(torch.randint(2, 9, (1,), generator=g))
        src = torch.randint(4, 40, (n,), generator=g).tolist()
        out.append((src, list(reversed(src))))
    return out


def train(store_dir: str, world_size: int, update_freq: int, out: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    from transformer.training.token_store import TokenStore
    model = Transformer(build_config("tiny", 40, dropout=0.0))  # no dropout: ranks draw other random bits
    config = TrainConfig(max_steps=STEPS, max_tokens=48, update_freq=update_freq, warmup_steps=2,
                         checkpoint_every_steps=0, precision="fp32", device="cpu", seed=5)
    trainer = Trainer(model, config, TokenStore(store_dir))
    trainer.train()
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(model.state_dict(), out)


def worker(rank: int, world_size: int, init_file: str, store_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        train(store_dir, world_size, 1, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_gloo_processes_equal_one_process_with_accumulation(tmp_path):
    store = write_token_store(tmp_path / "store", pairs(), vocab_size=40)
    single, ddp = tmp_path / "single.pt", tmp_path / "ddp.pt"
    train(str(store.path), 1, 2, str(single))
    mp.start_processes(worker, args=(2, str(tmp_path / "init"), str(store.path), str(ddp)), nprocs=2,
                       start_method="spawn")
    a, b = torch.load(single, weights_only=True), torch.load(ddp, weights_only=True)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(0)
    initial = Transformer(build_config("tiny", 40, dropout=0.0)).state_dict()
    changed = [n for n in a if not torch.allclose(a[n], initial[n], atol=1e-4)]
    assert len(changed) > len(a) // 2  # the six updates really moved the weights
