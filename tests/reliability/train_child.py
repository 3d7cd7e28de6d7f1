"""A training process for test_kill_resume (test code, not product code): the tiny preset with
dropout, gradient accumulation (update_freq 2) and a checkpoint every 2 updates.

    python tests/reliability/train_child.py STORE CHECKPOINT_DIR MAX_STEPS [--pause-before-rename STEP FLAG]

Prints ``resumed <step>`` after ``Trainer.resume()``, ``step <n>`` after every update,
``checkpoint <n>`` after every checkpoint and ``done <step>`` at the end (flushed at once, so
the parent can SIGKILL it at a chosen step). With ``--pause-before-rename``, the checkpoint of
STEP is written to its temporary file and the process then stops just before the rename,
after writing that temporary file's path to FLAG: the parent kills it there.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from transformer.config import build_config
from transformer.model import Transformer
from transformer.training.token_store import TokenStore
from transformer.training.trainer import TrainConfig, Trainer, TrainerCallback, list_checkpoints

VOCAB = 40
CONFIG = dict(max_tokens=96, update_freq=2, warmup_steps=4, checkpoint_every_steps=2, keep_checkpoints=3,
              precision="fp32", device="cpu", seed=11, log_every=1, clip_norm=1.0, pad_multiple=1)


class Progress(TrainerCallback):
    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        print(f"step {step}", flush=True)

    def on_checkpoint(self, step: int, path: Path) -> None:
        print(f"checkpoint {step}", flush=True)


def pause_before_rename(step: int, flag: Path) -> None:
    """Wrap os.replace (used by the atomic checkpoint write) to stop before renaming STEP's checkpoint."""
    real_replace = os.replace
    target = f"checkpoint_{step:08d}.pt"

    def replace(src, dst, *args, **kwargs):
        if Path(dst).name == target:
            staged = flag.with_name(flag.name + ".tmp")
            staged.write_text(str(src))
            real_replace(staged, flag)
            time.sleep(600)  # the parent SIGKILLs us here
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace


def main(store: str, checkpoint_dir: str, max_steps: int, pause: tuple[int, Path] | None) -> None:
    torch.set_num_threads(1)
    if pause is not None:
        pause_before_rename(*pause)
    # A resumed run starts from other initial weights: everything must come from the checkpoint.
    torch.manual_seed(999 if list_checkpoints(checkpoint_dir) else 123)
    model = Transformer(build_config("tiny", VOCAB, dropout=0.3, attention_dropout=0.1, activation_dropout=0.1))
    trainer = Trainer(model, TrainConfig(max_steps=max_steps, **CONFIG), TokenStore(store),
                      checkpoint_dir=checkpoint_dir, callbacks=[Progress()])
    trainer.resume()
    print(f"resumed {trainer.step}", flush=True)
    trainer.train()
    print(f"done {trainer.step}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    pause = None
    if "--pause-before-rename" in args:
        i = args.index("--pause-before-rename")
        pause = (int(args[i + 1]), Path(args[i + 2]))
        del args[i:i + 3]
    main(args[0], args[1], int(args[2]), pause)
