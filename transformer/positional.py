"""Positional encodings (§3.5): the paper's sinusoids and a learned alternative."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_encoding(max_len: int, d_model: int) -> Tensor:
    """Positional encoding (§3.5): PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Returns:
        (max_len, d_model) float32 tensor.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encoding needs an even d_model, got {d_model}")
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * inv_freq)
    pe[:, 1::2] = torch.cos(position * inv_freq)
    return pe.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (§3.5), kept as a non-persistent buffer (not in checkpoints)."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_encoding(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """(length, D) encodings of positions offset .. offset+length-1."""
        if offset + length > self.table.size(0):
            raise ValueError(f"position {offset + length} exceeds ModelConfig.max_positions {self.table.size(0)}")
        return self.table[offset:offset + length]


class LearnedPositions(nn.Module):
    """Learned position embeddings: a departure from the paper, which found them equal (Table 3 (E))."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)

    @property
    def table(self) -> Tensor:
        """(max_positions, D): the encodings of every position, as ``SinusoidalPositions.table``."""
        return self.embedding.weight

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """(length, D) embeddings of positions offset .. offset+length-1."""
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"position {offset + length} exceeds ModelConfig.max_positions {self.embedding.num_embeddings}")
        return self.embedding.weight[offset:offset + length]


# The position variants by ``ModelConfig.positional`` name, each built as cls(max_positions,
# d_model) and exposing ``table``. The names are ``config.POSITIONAL_NAMES`` (config validation
# loads no layer code); the model and the CTranslate2 export map a name to its class here.
POSITIONAL: dict[str, type[nn.Module]] = {
    "sinusoidal": SinusoidalPositions,
    "learned": LearnedPositions,
}
