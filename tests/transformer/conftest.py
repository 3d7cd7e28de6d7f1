"""Helpers for the tests of ``transformer/``: tiny fp32 models without dropout."""

from __future__ import annotations

import pytest
import torch

from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokens import EOS_ID, PAD_ID


def tiny_model(vocab_size: int = 24, seed: int = 0, **overrides) -> Transformer:
    """The ``tiny`` preset (d_model 32, 4 heads, 2+2 layers, dropout 0) in eval mode."""
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", vocab_size, **overrides))
    return model.eval()


def pad_batch(rows: list[list[int]], width: int | None = None, eos: bool = True) -> torch.Tensor:
    """Right-pad id lists (each followed by EOS when ``eos``) with PAD_ID into a (B, width) tensor."""
    rows = [list(r) + ([EOS_ID] if eos else []) for r in rows]
    width = width or max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out


@pytest.fixture
def model() -> Transformer:
    return tiny_model()


class CopyTask:
    """A tiny model trained by ``Trainer`` to copy its source, with held-out sentences."""

    def __init__(self, model: Transformer, held_out: list[list[int]], seconds: float) -> None:
        self.model, self.held_out, self.seconds = model, held_out, seconds


@pytest.fixture(scope="session")
def copy_task(tmp_path_factory) -> CopyTask:
    """Train the ``tiny`` preset (d_model 32, 2+2 layers) on copying 5-8 tokens from a
    vocabulary of 20: 1000 updates of ~70 sentences, eq. 3 with 50 warm-up steps (~10-20 s)."""
    import time

    import numpy as np

    from transformer.training.token_store import write_token_store
    from transformer.training.trainer import TrainConfig, Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    def sentences(n):
        return [rng.integers(4, 20, size=rng.integers(5, 9)).tolist() for _ in range(n)]

    train, held_out = sentences(3000), sentences(200)
    seen = {tuple(s) for s in train}
    held_out = [s for s in held_out if tuple(s) not in seen]
    store = write_token_store(tmp_path_factory.mktemp("copy") / "train", [(s, s) for s in train], vocab_size=20)
    torch.manual_seed(0)
    model = Transformer(build_config("tiny", 20))
    config = TrainConfig(max_tokens=640, warmup_steps=50, lr_scale=1.0, max_steps=1000, checkpoint_every_steps=0,
                         log_every=1000, precision="fp32", device="cpu", pad_multiple=1, seed=1)
    started = time.monotonic()
    Trainer(model, config, store).train()
    seconds = time.monotonic() - started
    torch.set_num_threads(threads)
    return CopyTask(model.eval(), held_out, seconds)
