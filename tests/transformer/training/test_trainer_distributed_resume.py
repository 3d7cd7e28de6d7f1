"""``Trainer.resume`` under torch.distributed when each rank has its own checkpoint folder (two
hosts, two disks): every rank resumes from the newest checkpoint of any rank, and ranks trained
with other settings fail alike instead of training apart. Two gloo processes on CPU, in process;
tests/team/test_two_host_training.py runs the train stage across two network namespaces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import TokenStore, write_token_store
from transformer.training.trainer import TrainConfig, Trainer, list_checkpoints

from .test_trainer_distributed import pairs

pytestmark = pytest.mark.training


def make_trainer(store: str, checkpoints: Path, max_steps: int, update_freq: int = 1,
                 max_tokens: int = 48) -> Trainer:
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 40, dropout=0.0))  # no dropout: ranks draw other random bits
    config = TrainConfig(max_steps=max_steps, max_tokens=max_tokens, update_freq=update_freq, warmup_steps=2,
                         checkpoint_every_steps=2, keep_checkpoints=10, precision="fp32", device="cpu", seed=5)
    return Trainer(model, config, TokenStore(store), checkpoint_dir=checkpoints)


def worker(rank: int, init_file: str, store: str, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    own = Path(root) / f"rank{rank}"            # this rank's "disk"
    report: dict = {}
    try:
        make_trainer(store, own, max_steps=4).train()    # rank 0 writes checkpoints 2 and 4 to its folder
        dist.barrier()
        if rank == 0:   # the hosts swap roles: now only rank 1's disk holds the checkpoints
            shutil.move(str(own), str(Path(root) / "rank1"))
        dist.barrier()
        trainer = make_trainer(store, own, max_steps=8)
        trainer.resume(on_change="error")
        report.update(resumed_step=trainer.step, resumed_from=trainer.resumed_from)
        trainer.train()
        if rank == 0:
            torch.save(trainer.model.state_dict(), Path(root) / "two_ranks.pt")
        # Rank 1 with another batch size: both ranks refuse, naming it, rather than train apart.
        other = make_trainer(store, Path(root) / f"other{rank}", max_steps=8, max_tokens=48 + 16 * rank)
        try:
            other.resume(on_change="restart")
        except ValueError as err:
            report["mismatch"] = str(err)
    finally:
        (Path(root) / f"report{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_every_rank_resumes_from_the_newest_checkpoint_of_any_rank(tmp_path):
    store = write_token_store(tmp_path / "store", pairs(), vocab_size=40)
    mp.start_processes(worker, args=(str(tmp_path / "init"), str(store.path), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["resumed_step"] == 4
        assert report["resumed_from"] == "rank 1's checkpoint_00000004.pt"
        assert report["mismatch"].startswith("rank 1 trains other settings or data than rank 0 "
                                             "(train.max_tokens: 48 -> 64)")
    assert [p.name for p in list_checkpoints(tmp_path / "rank0")] == [
        "checkpoint_00000006.pt", "checkpoint_00000008.pt"]   # rank 0 went on writing, from step 4

    single = make_trainer(str(store.path), tmp_path / "single", max_steps=8, update_freq=2)
    single.train()   # uninterrupted, one process, the same two batches per update
    two_ranks = torch.load(tmp_path / "two_ranks.pt", weights_only=True)
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(two_ranks[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
