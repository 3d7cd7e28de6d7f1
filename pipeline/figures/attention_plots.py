"""Attention heatmaps: one PNG per (sentence, attention kind, layer), heads in a grid,
source and target pieces on the axes."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch import Tensor  # noqa: E402

from transformer.atomic import atomic_write  # noqa: E402
from transformer.model import AttentionWeights  # noqa: E402

KINDS = {"encoder": "encoder self-attention", "decoder_self": "decoder self-attention", "cross": "cross attention"}


def plot_layer(weights: Tensor, query_labels: list[str], key_labels: list[str], title: str) -> bytes:
    """weights (h, T, S) of one layer -> PNG bytes with one heatmap per head."""
    heads = weights.size(0)
    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    width = min(0.25 * len(key_labels) + 1.2, 10.0)
    height = min(0.25 * len(query_labels) + 1.2, 10.0)
    # One y axis per row: the query pieces are written once, at the left (fewer labels to lay out,
    # which is most of the drawing time).
    fig, axes = plt.subplots(rows, cols, figsize=(cols * width, rows * height), squeeze=False, sharey=True)
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        # Each head on its own scale: diffuse heads would otherwise look uniformly dark.
        ax.imshow(weights[h].float().numpy(), cmap="viridis", vmin=0.0, aspect="auto")
        ax.set_title(f"head {h + 1}", fontsize=8)
        ax.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=6)
        if h % cols == 0:
            ax.set_yticks(range(len(query_labels)), query_labels, fontsize=6)
        else:
            ax.tick_params(axis="y", left=False, labelleft=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    return buffer.getvalue()


def plot_attention(weights: AttentionWeights, src_pieces: list[str], tgt_pieces: list[str],
                   out_dir: Path, name: str) -> list[Path]:
    """Write every layer's heatmaps of one sentence; returns the PNG paths.

    src_pieces include the final </s>; tgt_pieces are the decoder inputs (<s> + hypothesis).
    """
    written = []
    axes = {"encoder": (src_pieces, src_pieces), "decoder_self": (tgt_pieces, tgt_pieces),
            "cross": (tgt_pieces, src_pieces)}
    for kind, layers in (("encoder", weights.encoder), ("decoder_self", weights.decoder_self),
                         ("cross", weights.cross)):
        queries, keys = axes[kind]
        for layer, w in enumerate(layers, start=1):
            png = plot_layer(w[0].cpu(), queries, keys, f"{name}: {KINDS[kind]}, layer {layer}")
            path = out_dir / f"{name}_{kind}_layer{layer}.png"
            atomic_write(path, lambda f, data=png: f.write(data))
            written.append(path)
    return written
