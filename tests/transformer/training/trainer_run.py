"""Train a tiny model with ``Trainer`` in a fresh process (used by test_trainer's resume test).

    python tests/transformer/training/trainer_run.py STORE CHECKPOINT_DIR MAX_STEPS CHECKPOINT_EVERY [--resume]

Prints one JSON line: the trainer's step, epoch and batch_in_epoch at the end.
"""

from __future__ import annotations

import json
import sys

import torch

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import TokenStore
from transformer.training.trainer import TrainConfig, Trainer

VOCAB = 30


def main(store: str, checkpoint_dir: str, max_steps: int, every: int, resume: bool) -> None:
    torch.set_num_threads(1)
    # A resumed run starts from other initial weights: everything must come from the checkpoint.
    torch.manual_seed(999 if resume else 123)
    model = Transformer(build_config("tiny", VOCAB, dropout=0.3, attention_dropout=0.1, activation_dropout=0.1))
    config = TrainConfig(max_tokens=60, warmup_steps=4, max_steps=max_steps, checkpoint_every_steps=every,
                         keep_checkpoints=10, precision="fp32", device="cpu", seed=7, log_every=1000,
                         pad_multiple=1, clip_norm=1.0)
    trainer = Trainer(model, config, TokenStore(store), checkpoint_dir=checkpoint_dir)
    if resume:
        trainer.resume()
        assert trainer.step == every, trainer.step
    trainer.train()
    print(json.dumps({"step": trainer.step, "epoch": trainer.epoch, "batch_in_epoch": trainer.batch_in_epoch}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "--resume" in sys.argv[5:])
