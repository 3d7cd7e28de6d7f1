"""Train the tiny model on one GPU under torchrun, in an NCCL process group (used by test_trainer_cuda).

    torchrun --standalone --nproc_per_node=1 tests/gpu/nccl_run.py STORE CHECKPOINT_DIR MAX_STEPS EVERY [--resume]

Prints one JSON line: the process group's backend and size, the result of an NCCL all-reduce, the
trainer's device, and its step, epoch and batch_in_epoch at the end.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import TokenStore
from transformer.training.trainer import TrainConfig, Trainer

VOCAB = 30


def main(store: str, checkpoint_dir: str, max_steps: int, every: int, resume: bool) -> None:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # before NCCL: its communicator binds to it
    dist.init_process_group("nccl")
    try:
        probe = torch.full((1,), 2.0, device="cuda")
        dist.all_reduce(probe)  # an NCCL collective really runs
        # A resumed run starts from other initial weights: everything must come from the checkpoint.
        torch.manual_seed(999 if resume else 123)
        model = Transformer(build_config("tiny", VOCAB, dropout=0.3, attention_dropout=0.1, activation_dropout=0.1))
        config = TrainConfig(max_tokens=60, warmup_steps=4, max_steps=max_steps, checkpoint_every_steps=every,
                             keep_checkpoints=10, precision="fp32", device="cuda", seed=7, log_every=1000,
                             clip_norm=1.0)
        trainer = Trainer(model, config, TokenStore(store), checkpoint_dir=checkpoint_dir)
        if resume:
            trainer.resume()
            assert trainer.step == every, trainer.step
        trainer.train()
        print(json.dumps({"backend": dist.get_backend(), "world_size": dist.get_world_size(),
                          "all_reduce": probe.item(), "device": trainer.device.type, "step": trainer.step,
                          "epoch": trainer.epoch, "batch_in_epoch": trainer.batch_in_epoch}), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "--resume" in sys.argv[5:])
