"""The loss on held-out data (§5, §6: the development set's perplexity the paper reports)."""

from __future__ import annotations

import math

import torch

from ..model import Transformer
from ..precision import autocast
from .batching import TokenBatchSampler, collate
from .loss import projected_label_smoothed_cross_entropy
from .token_store import TokenStore
from .train_config import TrainConfig


@torch.no_grad()
def evaluate_loss(model: Transformer, data: TokenStore, config: TrainConfig, precision: str,
                  device: torch.device) -> dict[str, float]:
    """Mean label-smoothed loss, NLL and perplexity per target token on ``data``, batched as
    training batches (``config.max_tokens``, ``pad_multiple``) in length order; the model is left
    in training mode."""
    model.eval()
    sampler = TokenBatchSampler(data.lengths["src"], data.lengths["tgt"], config.max_tokens, shuffle=False,
                                max_positions=model.config.max_positions, pad_multiple=config.pad_multiple)
    loss = nll = 0.0
    tokens = 0
    for idx in sampler.batches(0):
        batch = collate(data, idx, config.pad_multiple).to(device)
        with autocast(precision, device):
            hidden = model(batch.src, batch.tgt_in, project=False)
            out = projected_label_smoothed_cross_entropy(
                hidden, model.output.weight, batch.tgt_out, model.config.pad_id, config.label_smoothing)
        loss += float(out.loss)
        nll += float(out.nll)
        tokens += int(out.n_tokens)
    model.train()
    tokens = max(tokens, 1)
    return {"valid/loss": loss / tokens, "valid/nll": nll / tokens, "valid/ppl": math.exp(min(nll / tokens, 50.0))}
