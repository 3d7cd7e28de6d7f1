"""A stop that reaches one rank only (a scheduler's SIGTERM, the ``max_minutes`` clock) stops every
rank after the same update (``transformer/training/stopping.py``): two gloo processes on CPU end at one
step, rank 0 writes one resume point, both exit 0, and the resumed training ends with the weights of
an uninterrupted one (``torch.equal``), with dropout 0.1: the ranks' dropout masks come from
generators each in a state of its own, all of them in rank 0's checkpoint (``transformer/training/rng_states.py``)
and each restored on its rank. The stop lands on a chosen update through a wrapper around
``Trainer._update`` (no timing: a signal sent by the rank to itself, a clock budget marked spent)."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
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

STEPS, EVERY = 10, 5
DROPOUT = 0.1        # the recipes': each rank's masks must resume where they were
TRIGGER = 3          # the update after which one rank is told to stop; all stop after the next one
# (what stops, which rank is told): a SIGTERM to the rank that does not write, one to the rank that
# does, and the clock budget spent on the rank that does not write.
CASES = {"sigterm_rank1": ("signal", 1), "sigterm_rank0": ("signal", 0), "clock_rank1": ("clock", 1)}


def make_trainer(store: str, checkpoints: Path, max_minutes: float = 0.0) -> Trainer:
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 40, dropout=DROPOUT))
    config = TrainConfig(max_steps=STEPS, max_minutes=max_minutes, max_tokens=48, warmup_steps=2,
                         checkpoint_every_steps=EVERY, keep_checkpoints=10, log_every=2, precision="fp32",
                         device="cpu", seed=5)
    return Trainer(model, config, TokenStore(store), checkpoint_dir=checkpoints)


def stop_once(trainer: Trainer, what: str) -> None:
    """After this rank's update TRIGGER: SIGTERM to this process, or this rank's clock budget spent."""
    real = trainer._update

    def update(group, vote, *rest):
        out = real(group, vote, *rest)
        if trainer.step + 1 == TRIGGER:   # the loop counts the update once this returns
            if what == "signal":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                trainer.elapsed_seconds = 60 * trainer.config.max_minutes
        return out

    trainer._update = update


def worker(rank: int, init_file: str, store: str, root: str) -> None:
    torch.set_num_threads(1)
    # A rank left waiting (the bug this guards against) fails within a minute instead of hanging.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    root_dir, report = Path(root), {}
    try:
        straight = make_trainer(store, root_dir / "straight")
        straight.train()
        if rank == 0:
            torch.save(straight.model.state_dict(), root_dir / "straight.pt")
        for case, (what, told) in CASES.items():
            budget = 60.0 if what == "clock" else 0.0   # an hour: only the marked rank runs out
            stopped = make_trainer(store, root_dir / case, budget)
            if rank == told:
                stop_once(stopped, what)
            stopped.train()
            live = torch.get_rng_state()   # this rank's generator at the stop
            dist.barrier()   # rank 0 has written its checkpoint
            files = sorted(p.name for p in (root_dir / case).iterdir())
            point = torch.load(root_dir / case / files[0], weights_only=True)
            saved = [entry["cpu"] for entry in point["rng_ranks"]]
            resumed = make_trainer(store, root_dir / case, budget)
            resumed.resume()
            report[case] = {"step": stopped.step, "stopped_early": stopped.stopped_early,
                            "stop_requested": stopped.stop_requested, "files": files,
                            "resumed_step": resumed.step, "ranks_saved": len(saved),
                            "saved_own": torch.equal(saved[rank], live),     # the checkpoint holds it
                            "resumed_own": torch.equal(torch.get_rng_state(), live),   # and gave it back
                            "rank0_keys": torch.equal(point["rng_cpu"], saved[0]),
                            "ranks_differ": not torch.equal(saved[0], saved[1])}
            resumed.train()
            report[case].update(final_step=resumed.step, final_early=resumed.stopped_early)
            if rank == 0:
                torch.save(resumed.model.state_dict(), root_dir / f"{case}.pt")
            dist.barrier()
    finally:
        (root_dir / f"report{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_a_stop_on_one_rank_stops_every_rank_at_the_same_update(tmp_path):
    store = write_token_store(tmp_path / "store", pairs(), vocab_size=40)
    # Both processes must exit 0: start_processes raises otherwise (a rank left waiting, a lost peer).
    mp.start_processes(worker, args=(str(tmp_path / "init"), str(store.path), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    for case in CASES:
        for rank, report in enumerate(reports):
            got = report[case]
            assert got["step"] == TRIGGER + 1, (case, rank, got)   # the vote travels with the next update
            assert got["stopped_early"] and got["stop_requested"], (case, rank)
            assert got["files"] == [f"checkpoint_{TRIGGER + 1:08d}.resume.pt"], (case, rank)  # one, rank 0's
            assert got["resumed_step"] == TRIGGER + 1 and got["final_step"] == STEPS and not got["final_early"]
            assert got["ranks_saved"] == 2 and got["saved_own"] and got["resumed_own"], (case, rank, got)
            assert got["rank0_keys"], (case, rank)     # rng_cpu stays rank 0's, as one process's
            assert got["ranks_differ"], (case, rank)   # what one state for all ranks would get wrong
        assert [p.name for p in list_checkpoints(tmp_path / case, resume_points=True)] == [
            "checkpoint_00000005.pt", "checkpoint_00000010.pt"]   # the resume point gone, as never written
        resumed = torch.load(tmp_path / f"{case}.pt", weights_only=True)
        assert resumed.keys() == straight.keys()
        for name in straight:
            assert torch.equal(resumed[name], straight[name]), (case, name)
