"""Each rank's random number generators in a checkpoint, so that a resumed training draws the
dropout masks (§5.4) an uninterrupted one draws, on every rank.

Every rank is seeded alike, but the ranks train on other batches, whose shapes decide how many
random numbers dropout draws: after a few updates each rank's generators are in a state of their
own. One process stores its states as ``rng_cpu`` and ``rng_cuda`` (one per GPU it sees), as
always. Several processes (torch.distributed) gather every rank's into ``rng_ranks`` (a list
indexed by rank, each ``{"cpu": tensor, "cuda": [tensor, ...]}``) of the checkpoint rank 0 writes,
beside rank 0's own under the old keys; on resume each rank restores its own entry.

Another number of processes: ``world_size`` is part of ``Trainer.fingerprint``, so a checkpoint
written by another number of processes is never resumed (the pipeline restarts the training,
``Trainer.resume(on_change="error")`` refuses). A state loaded some other way (an older checkpoint
without ``rng_ranks``, or one of another ``world_size`` given to ``Trainer.load_state_dict``) gives
every rank rank 0's states, as checkpoints did before ``rng_ranks``: the weights resume, and with
dropout the ranks other than 0 draw other masks than an uninterrupted run would.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def local() -> dict[str, Any]:
    """This process's generator states: the CPU one and one per visible GPU."""
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def gather(world_size: int) -> list[dict[str, Any]] | None:
    """Every rank's ``local()`` states, indexed by rank; ``None`` for one process.

    A collective (``all_gather_object``): every rank must call it at the same point, which
    ``Trainer.save`` does (all ranks save at the same update; only rank 0 writes)."""
    if world_size == 1:
        return None
    states: list[Any] = [None] * world_size
    dist.all_gather_object(states, local())
    return states


def restore(state: dict[str, Any], rank: int, world_size: int) -> None:
    """Set this process's generators from a checkpoint's ``state``: this rank's own entry of
    ``rng_ranks`` when it holds one per rank of this run, else rank 0's (``rng_cpu``/``rng_cuda``)."""
    ranks = state.get("rng_ranks")
    mine = ranks[rank] if ranks and len(ranks) == world_size else {"cpu": state["rng_cpu"], "cuda": state["rng_cuda"]}
    # load_checkpoint maps every tensor to the training device; RNG states must be CPU tensors.
    torch.set_rng_state(mine["cpu"].cpu())
    if torch.cuda.is_available() and mine["cuda"]:
        # One state per GPU of the machine that saved it (dropout on CUDA draws from these);
        # a machine with fewer GPUs restores those it has rather than failing on the others.
        torch.cuda.set_rng_state_all([s.cpu() for s in mine["cuda"]][:torch.cuda.device_count()])
