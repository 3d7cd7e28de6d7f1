"""DVC stage 3: train the Transformer (§5) with the package's Trainer.

Checkpoints go to a ``persist: true`` folder: when the stage is interrupted (killed,
pre-empted) and run again, training resumes from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeline import paths
from pipeline.curves import CurveWriter
from pipeline.io import write_json
from pipeline.params import ParamsError, load_params, run_stage
from pipeline.tracking import MlflowCallback, run_tags
from transformer.data import TokenStore
from transformer.model import Transformer
from transformer.trainer import Trainer, TrainerCallback


TRACKED_SECTIONS = ("data", "tokenizer", "model", "train", "tracking")


def train(callbacks: list[TrainerCallback] | None = None) -> dict[str, float]:
    params = load_params()
    train_data = TokenStore(paths.token_store("train"))
    valid_data = TokenStore(paths.token_store(params.data.valid_set))
    config = params.model.config(train_data.vocab_size)
    torch.manual_seed(params.train.seed)
    model = Transformer(config)
    curves = CurveWriter(paths.TRAIN_CURVE, paths.VALID_CURVE)
    tracked = {k: v for k, v in params.flat().items() if k.split(".")[0] in TRACKED_SECTIONS}
    derived = {"parameters": model.num_parameters(), "vocab_size": config.vocab_size,
               "train_pairs": len(train_data), "train_target_tokens": train_data.num_tokens("tgt")}
    try:
        trainer = Trainer(model, params.train, train_data, valid_data=valid_data,
                          checkpoint_dir=paths.CHECKPOINT_DIR, callbacks=[curves, *(callbacks or [])])
    except ValueError as err:
        raise ParamsError(f"params.yaml: {err}") from None
    mlflow_cb = MlflowCallback(params.tracking.experiment, tracked, derived,
                               run_tags(params.data.dataset, params.data.pair, str(trainer.device)))
    trainer.callbacks.append(mlflow_cb)
    restored = trainer.resume(on_change="restart")
    if restored is not None:
        curves.restore(restored)
        mlflow_cb.restore(restored)
        print(f"resuming from step {trainer.step} (epoch {trainer.epoch})", flush=True)
    print(f"model: {model.num_parameters():,} parameters, vocabulary {config.vocab_size}, "
          f"{len(train_data):,} training pairs, device {trainer.device}, precision {params.train.precision}",
          flush=True)
    start = time.monotonic()
    valid = trainer.train()
    summary = {"steps": trainer.step, "epochs": trainer.epoch, "train_seconds": round(trainer.elapsed_seconds, 1),
               "parameters": model.num_parameters(), **{k.replace("/", "_"): v for k, v in valid.items()}}
    write_json(paths.TRAIN_METRICS, summary)
    print(f"trained {trainer.step} steps in {time.monotonic() - start:.0f} s: {summary}", flush=True)
    return summary


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    train()


if __name__ == "__main__":
    run_stage(main)
