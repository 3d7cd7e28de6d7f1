"""The figures and worked numbers of ``docs/paper.md``, each computed by the package's own code.

    python -m pipeline.figures.paper_figures --out docs/figures \
        [--model models/model.pt --tokenizer data/tokenizer/spm.model]

Writes one PNG per figure (``FIGURES``), ``worked_numbers.json`` (every number the figures and the
document show) and ``worked_numbers.md`` (the same as tables). Every number comes from a function
or class of ``transformer/`` named next to it; nothing is re-implemented here except the hand
computations they are checked against. The decoding example uses the trained model when
``--model`` and ``--tokenizer`` are given (``make docs`` passes them after ``make run``), and
otherwise a tiny randomly initialised model, which the outputs say.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from transformer import BOS_ID, EOS_ID, PAD_ID, PRESETS, Transformer, beam_search, build_config, greedy_search  # noqa: E402
from transformer.atomic import write_bytes, write_json, write_text  # noqa: E402
from transformer.attention import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402
from transformer.checkpoint import average_checkpoints, model_checkpoint, save_checkpoint  # noqa: E402
from transformer.dropout import dropout  # noqa: E402
from transformer.layers import FeedForward  # noqa: E402
from transformer.positional import sinusoidal_encoding  # noqa: E402
from transformer.search import length_penalty  # noqa: E402
from transformer.training.loss import label_smoothed_cross_entropy  # noqa: E402
from transformer.training.schedule import inverse_sqrt_lr, make_optimizer, make_scheduler  # noqa: E402

FIGURES = ("positional_encoding.png", "masks.png", "attention_worked.png", "multi_head_attention.png",
           "residual_norms.png", "label_smoothing.png", "learning_rate.png", "length_penalty.png",
           "decoding.png")

# The hand-sized attention example: 3 tokens, d_k = 4.
ATTENTION_TOKENS = ["the", "cat", "sat"]
ATTENTION_Q = [[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]]
ATTENTION_K = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
ATTENTION_V = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 2.0], [0.0, 0.0, 1.0, 3.0]]

# The label smoothing example: a 6-word vocabulary, the reference word, some model logits.
SMOOTHING_VOCAB = ["ein", "Hund", "läuft", "im", "Schnee", "</s>"]
SMOOTHING_GOLD = 1
SMOOTHING_LOGITS = [0.5, 2.0, 0.1, -0.3, 0.0, 0.2]
EPSILON = 0.1

# A short Multi30k test_2016_flickr pair (line 41), unseen in training.
SOURCE = "A girl wearing a life vest floats in water."
REFERENCE = "Ein Mädchen in einer Rettungsweste treibt im Wasser."

# The paper's base learning rate (§5.3) and this repository's default (params.yaml), for the curve.
PAPER_SCHEDULE = {"d_model": 512, "warmup_steps": 4000, "scale": 1.0, "steps": 100_000}
REPO_SCHEDULE = {"d_model": 256, "warmup_steps": 300, "scale": 0.6, "steps": 3600}


def _png(fig: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _annotated(ax: plt.Axes, values: np.ndarray, title: str, rows: list[str], cols: list[str],
               fmt: str = "{:.3f}", cmap: str = "viridis") -> None:
    """A heatmap with every value written in its cell."""
    ax.imshow(values, cmap=cmap, aspect="auto")
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    span = float(np.nanmax(values) - np.nanmin(values)) or 1.0
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            light = (v - np.nanmin(values)) / span < 0.6
            ax.text(j, i, "-inf" if np.isneginf(v) else fmt.format(v), ha="center", va="center",
                    fontsize=7, color="white" if light else "black")


def _rounded(t: torch.Tensor, digits: int = 4) -> list:
    return np.round(t.detach().double().numpy(), digits).tolist()


# §3.4 and §3.5 -------------------------------------------------------------------------------

def positional_encoding() -> tuple[dict[str, Any], bytes]:
    """``sinusoidal_encoding`` (§3.5): the matrix for 64 positions x 128 dimensions, and some columns."""
    pe = sinusoidal_encoding(64, 128)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    image = left.imshow(pe.numpy(), cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
    left.set_xlabel("dimension i (even: sin, odd: cos)")
    left.set_ylabel("position pos")
    left.set_title("PE(pos, i), d_model = 128", fontsize=9)
    fig.colorbar(image, ax=left, fraction=0.04)
    for dim in (4, 10, 20, 40):
        right.plot(pe[:, dim].numpy(), label=f"i = {dim}")
    right.set_xlabel("position pos")
    right.set_title("four columns: the wavelength grows with i (2π up to 10000·2π)", fontsize=9)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    base = sinusoidal_encoding(3, 512)
    numbers = {
        "d_model": 512,
        "pe_pos0_first4": _rounded(base[0, :4]),
        "pe_pos1_first4": _rounded(base[1, :4]),
        "pe_pos2_first4": _rounded(base[2, :4]),
        "hand_pos1_dim2": round(math.sin(1 / 10000 ** (2 / 512)), 4),
        "wavelength_dim0": round(2 * math.pi, 4),
        "wavelength_last_pair": round(2 * math.pi * 10000 ** ((512 - 2) / 512), 1),
    }
    return numbers, _png(fig)


def embedding_scale(model: Transformer) -> dict[str, Any]:
    """``Embedding`` (§3.4): token rows are initialised N(0, d^-1/2), so after x sqrt(d_model) they have
    about unit size, the same order as the positional encodings they are added to."""
    weights = model.src_embed.tokens.weight[4:].detach()  # the specials' rows (pad is zero) left out
    d = model.config.d_model
    return {
        "d_model": d, "scale": round(model.src_embed.scale, 4), "sqrt_512": round(math.sqrt(512), 4),
        "row_std_before": round(float(weights.std()), 4),
        "row_std_after": round(float((weights * model.src_embed.scale).std()), 4),
        "positional_std": round(float(sinusoidal_encoding(model.config.max_positions, d).std()), 4),
    }


# §3.2 -----------------------------------------------------------------------------------------

def masks(model: Transformer) -> tuple[dict[str, Any], bytes]:
    """The padding mask (``Transformer.source_mask``) and the causal mask (``is_causal`` of
    ``scaled_dot_product_attention``), shown as the weights of all-equal scores under each."""
    src = torch.tensor([[5, 6, 7, 8, EOS_ID], [9, 10, EOS_ID, PAD_ID, PAD_ID]])
    src_mask = model.source_mask(src)                              # (2, 1, 1, 5)
    zeros = torch.zeros(1, 5, 4)
    values = torch.eye(5, 4)
    _, padded = scaled_dot_product_attention(zeros, zeros, values, src_mask[1, 0], return_weights=True)
    _, causal = scaled_dot_product_attention(zeros, zeros, values, is_causal=True, return_weights=True)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1, 1]})
    labels = ["w1", "w2", "w3", "w4", "</s>"]
    _annotated(axes[0], src_mask[:, 0, 0].float().numpy(), "padding mask (B, S): 1 = real token",
               ["sentence 1", "sentence 2"], ["1", "2", "3", "4", "5"], fmt="{:.0f}")
    _annotated(axes[1], padded[0].numpy(), "sentence 2: weights of equal scores\n(pads get 0)",
               [f"q{i}" for i in range(1, 6)], ["w1", "w2", "</s>", "pad", "pad"], fmt="{:.2f}")
    _annotated(axes[2], causal[0].numpy(), "causal mask: weights of equal scores\n(row i sees keys 1..i)",
               [f"q{i}" for i in range(1, 6)], labels, fmt="{:.2f}")
    numbers = {
        "padding_mask": src_mask[:, 0, 0].int().tolist(),
        "padding_weights_sentence2": _rounded(padded[0], 4),
        "causal_mask": (causal[0] > 0).int().tolist(),
        "causal_weights": _rounded(causal[0], 4),
    }
    return numbers, _png(fig)


def hand_attention(q: list[list[float]], k: list[list[float]], v: list[list[float]]) -> dict[str, list]:
    """Eq. 1 with plain Python arithmetic: what ``scaled_dot_product_attention`` is checked against."""
    d_k = len(q[0])
    scores = [[sum(a * b for a, b in zip(qi, kj)) / math.sqrt(d_k) for kj in k] for qi in q]
    weights = []
    for row in scores:
        exps = [math.exp(s - max(row)) for s in row]
        weights.append([e / sum(exps) for e in exps])
    out = [[sum(w * vj[c] for w, vj in zip(row, v)) for c in range(len(v[0]))] for row in weights]
    return {"scores": scores, "weights": weights, "output": out}


def attention_worked() -> tuple[dict[str, Any], bytes]:
    """``scaled_dot_product_attention`` (§3.2.1, eq. 1) on 3 tokens with d_k = 4, next to the hand computation."""
    q, k, v = (torch.tensor(x, dtype=torch.float64) for x in (ATTENTION_Q, ATTENTION_K, ATTENTION_V))
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    scores = q @ k.T / math.sqrt(q.size(-1))
    hand = hand_attention(ATTENTION_Q, ATTENTION_K, ATTENTION_V)
    difference = max(float((weights - torch.tensor(hand["weights"], dtype=torch.float64)).abs().max()),
                     float((out - torch.tensor(hand["output"], dtype=torch.float64)).abs().max()))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), gridspec_kw={"width_ratios": [3, 3, 4]})
    _annotated(axes[0], scores.numpy(), "scores QKᵀ / √d_k (√4 = 2)", ATTENTION_TOKENS, ATTENTION_TOKENS,
               fmt="{:.2f}")
    _annotated(axes[1], weights.numpy(), "softmax weights (rows sum to 1)", ATTENTION_TOKENS, ATTENTION_TOKENS)
    _annotated(axes[2], out.numpy(), "output = weights · V", ATTENTION_TOKENS, ["1", "2", "3", "4"])
    axes[0].set_ylabel("query")
    for ax in axes[:2]:
        ax.set_xlabel("key")
    numbers = {
        "tokens": ATTENTION_TOKENS, "Q": ATTENTION_Q, "K": ATTENTION_K, "V": ATTENTION_V, "d_k": 4,
        "scores": _rounded(scores), "weights": _rounded(weights), "output": _rounded(out),
        "row_sums": _rounded(weights.sum(-1)), "max_difference_from_hand": difference,
    }
    return numbers, _png(fig)


def multi_head(d_model: int = 8, n_heads: int = 2, seed: int = 0) -> tuple[dict[str, Any], bytes]:
    """``MultiHeadAttention`` (§3.2.2) on 3 tokens, d_model 8, 2 heads: the shapes, each head's weights,
    and the output rebuilt head by head with ``scaled_dot_product_attention``."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(d_model, n_heads).eval()
    x = torch.randn(1, 3, d_model)
    with torch.no_grad():
        out, weights = mha(x, need_weights=True)                   # (1, 3, 8), (1, 2, 3, 3)
        w_q, w_k, w_v = mha.in_proj.weight.split(d_model)
        b_q, b_k, b_v = mha.in_proj.bias.split(d_model)
        d = d_model // n_heads
        heads = []
        for h in range(n_heads):
            cols = slice(h * d, (h + 1) * d)
            q = x[0] @ w_q[cols].T + b_q[cols]
            k = x[0] @ w_k[cols].T + b_k[cols]
            v = x[0] @ w_v[cols].T + b_v[cols]
            heads.append(scaled_dot_product_attention(q, k, v)[0])
        rebuilt = torch.cat(heads, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias
    fig, axes = plt.subplots(1, n_heads, figsize=(4 * n_heads, 3.2))
    for h, ax in enumerate(axes):
        _annotated(ax, weights[0, h].numpy(), f"head {h + 1}: softmax(Q_h K_hᵀ / √{d})", ATTENTION_TOKENS,
                   ATTENTION_TOKENS)
    numbers = {
        "d_model": d_model, "n_heads": n_heads, "d_head": d,
        "shapes": {"x": [1, 3, d_model], "per_head_q_k_v": [1, n_heads, 3, d], "weights": list(weights.shape),
                   "concat": [1, 3, d_model], "output": list(out.shape)},
        "weights": _rounded(weights[0], 3),
        "max_difference_head_by_head": float((rebuilt - out[0]).abs().max()),
        "base_d_head": 512 // 8,
    }
    return numbers, _png(fig)


# §3.1, §3.3, §3.4 ------------------------------------------------------------------------------

def residual_norms(layers: int = 12, seed: int = 0) -> tuple[dict[str, Any], bytes]:
    """``Residual`` (Add & Norm): the size (RMS) of the residual stream after each encoder layer of a
    randomly initialised stack, post-LN (the paper) against pre-LN (``norm_first``)."""
    rms: dict[str, list[float]] = {}
    src = torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(seed))
    for name, norm_first in (("post-LN (paper)", False), ("pre-LN (norm_first)", True)):
        torch.manual_seed(seed)
        model = Transformer(build_config("tiny", 64, n_encoder_layers=layers, n_decoder_layers=1,
                                         norm_first=norm_first)).eval()
        seen: list[float] = []
        def record(module: torch.nn.Module, inputs: Any, output: torch.Tensor, seen: list[float] = seen) -> None:
            seen.append(float(output.pow(2).mean().sqrt()))
        hooks = [layer.register_forward_hook(record) for layer in model.encoder_layers]
        with torch.no_grad():
            model.encode(src)
        for hook in hooks:
            hook.remove()
        rms[name] = [round(v, 4) for v in seen]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for name, values in rms.items():
        ax.plot(range(1, layers + 1), values, marker="o", label=name)
    ax.set_xlabel("encoder layer")
    ax.set_ylabel("RMS of the residual stream")
    ax.set_title("Add & Norm: post-LN renormalises every layer; pre-LN lets the stream grow", fontsize=9)
    ax.legend(fontsize=8)
    return {"layers": layers, "rms": rms}, _png(fig)


def feed_forward() -> dict[str, Any]:
    """``FeedForward`` (§3.3, eq. 2): parameters of the base model's network, and one pass on 3 positions."""
    base = FeedForward(build_config("base", 37000))
    tiny_config = build_config("tiny", 64)
    torch.manual_seed(0)
    tiny = FeedForward(tiny_config).eval()
    x = torch.randn(1, 3, tiny_config.d_model)
    with torch.no_grad():
        hidden = torch.relu(tiny.linear1(x))
        out = tiny(x)
    return {
        "base_shapes": {"W1": list(base.linear1.weight.T.shape), "W2": list(base.linear2.weight.T.shape)},
        "base_parameters": sum(p.numel() for p in base.parameters()),
        "tiny_shapes": {"x": list(x.shape), "hidden": list(hidden.shape), "output": list(out.shape)},
        "tiny_hidden_zero_fraction": round(float((hidden == 0).float().mean()), 3),
    }


def stacks() -> dict[str, Any]:
    """Parameter counts of the presets (built on the meta device: no memory), by part, with the
    tied output projection (§3.4) counted once."""
    vocab = {"tiny": 64, "small": 8000, "laptop": 8000, "base": 37000, "big": 37000}
    rows = {}
    for preset in PRESETS:
        with torch.device("meta"):
            model = Transformer(build_config(preset, vocab[preset]))
        count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
        rows[preset] = {
            "vocab_size": vocab[preset], **{k: v for k, v in PRESETS[preset].items() if k != "max_positions"},
            "embeddings": model.src_embed.tokens.weight.numel(),
            "encoder": count(model.encoder_layers), "decoder": count(model.decoder_layers),
            "total": model.num_parameters(),
            "tied": model.output.weight is model.tgt_embed.tokens.weight,
        }
    return rows


# §5.3 and §5.4 ---------------------------------------------------------------------------------

def regularisation() -> tuple[dict[str, Any], bytes]:
    """``dropout`` (§5.4) on ones, and label smoothing (§5.4): the smoothed target of a 6-word vocabulary,
    and ``label_smoothed_cross_entropy`` against the cross-entropy with that target by hand."""
    torch.manual_seed(0)
    dropped = dropout(torch.ones(100_000), 0.1, training=True)
    vocab = len(SMOOTHING_VOCAB)
    target = torch.full((vocab,), EPSILON / vocab, dtype=torch.float64)
    target[SMOOTHING_GOLD] += 1.0 - EPSILON
    logits = torch.tensor([[SMOOTHING_LOGITS]])                     # (B=1, T=1, V=6)
    out = label_smoothed_cross_entropy(logits, torch.tensor([[SMOOTHING_GOLD]]), pad_id=-100, epsilon=EPSILON)
    probs = torch.softmax(logits[0, 0].double(), dim=-1)
    by_hand = float(-(target * probs.log()).sum())
    fig, ax = plt.subplots(figsize=(7, 3.2))
    x = np.arange(vocab)
    one_hot = np.eye(vocab)[SMOOTHING_GOLD]
    ax.bar(x - 0.27, one_hot, 0.27, label="one-hot target")
    ax.bar(x, target.numpy(), 0.27, label=f"smoothed target (ε = {EPSILON})")
    ax.bar(x + 0.27, probs.numpy(), 0.27, label="model softmax of the example logits")
    for xi, t in zip(x, target.numpy()):
        ax.text(xi, t + 0.02, f"{t:.4f}", ha="center", fontsize=7)
    ax.set_xticks(x, SMOOTHING_VOCAB)
    ax.set_ylim(0, 1.1)
    ax.set_title(f"label smoothing: gold '{SMOOTHING_VOCAB[SMOOTHING_GOLD]}' gets 1 - ε + ε/V, "
                 "every other word ε/V", fontsize=9)
    ax.legend(fontsize=7)
    numbers = {
        "vocab": SMOOTHING_VOCAB, "gold": SMOOTHING_VOCAB[SMOOTHING_GOLD], "epsilon": EPSILON,
        "target": _rounded(target, 5), "target_sum": round(float(target.sum()), 6),
        "logits": SMOOTHING_LOGITS, "model_probs": _rounded(probs, 4),
        "loss_code": round(float(out.loss), 5), "loss_by_hand": round(by_hand, 5),
        "nll": round(float(out.nll), 5),
        "dropout": {"p": 0.1, "zero_fraction": round(float((dropped == 0).float().mean()), 4),
                    "kept_value": round(float(dropped.max()), 4), "mean": round(float(dropped.mean()), 4)},
    }
    return numbers, _png(fig)


def learning_rate(repo: dict[str, Any] = REPO_SCHEDULE) -> tuple[dict[str, Any], bytes]:
    """``inverse_sqrt_lr`` (§5.3, eq. 3) for the paper's base model and this repository's default, and the
    rate ``make_scheduler`` gives the optimiser (``make_optimizer``: Adam, betas and eps of §5.3)."""
    curves = {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for ax, (name, s) in zip(axes, (("paper base", PAPER_SCHEDULE), ("this repository's default", repo))):
        steps = np.arange(1, s["steps"] + 1)
        lr = np.array([inverse_sqrt_lr(int(t), s["d_model"], s["warmup_steps"], s["scale"]) for t in steps])
        peak = int(steps[lr.argmax()])
        expected = s["scale"] * s["d_model"] ** -0.5 * s["warmup_steps"] ** -0.5
        curves[name] = {**s, "peak_step": peak, "peak_lr": float(lr.max()), "eq3_peak": expected,
                        "lr_at_end": float(lr[-1])}
        ax.plot(steps, lr)
        ax.axvline(s["warmup_steps"], color="grey", linestyle=":")
        ax.annotate(f"peak {lr.max():.2e} at step {peak}", (peak, lr.max()), textcoords="offset points",
                    xytext=(10, -12), fontsize=8)
        ax.set_title(f"{name}: d_model {s['d_model']}, warm-up {s['warmup_steps']}, scale {s['scale']}",
                     fontsize=9)
        ax.set_xlabel("update step")
        ax.set_ylabel("learning rate")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = make_optimizer([param], fused=False)
    scheduler = make_scheduler(optimizer, repo["d_model"], repo["warmup_steps"], repo["scale"])
    rates = []
    for _ in range(repo["warmup_steps"]):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    group = optimizer.param_groups[0]
    numbers = {"curves": curves, "adam": {"betas": list(group["betas"]), "eps": group["eps"]},
               "scheduler_lr_update_1": rates[0], "scheduler_lr_at_warmup": rates[-1]}
    return numbers, _png(fig)


# §6.1 -----------------------------------------------------------------------------------------

def length_penalty_example() -> tuple[dict[str, Any], bytes]:
    """``length_penalty`` (GNMT, used in §6.1): lp(L) for several alphas, and which of two hypotheses a
    beam search keeps: a short one (log-probability -3.0, 5 tokens) or a longer one (-3.6, 8 tokens)."""
    lengths = np.arange(1, 31)
    alphas = (0.0, 0.6, 1.0, 2.0)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for alpha in alphas:
        ax.plot(lengths, [length_penalty(int(n), alpha) for n in lengths], label=f"α = {alpha}")
    ax.set_xlabel("hypothesis length |Y| (tokens, EOS included)")
    ax.set_ylabel("lp = ((5 + |Y|) / 6)^α")
    ax.set_title("beam scores are log P(Y|X) / lp: a larger α favours longer outputs", fontsize=9)
    ax.legend(fontsize=8)
    choices = {}
    for alpha in alphas:
        short, long = -3.0 / length_penalty(5, alpha), -3.6 / length_penalty(8, alpha)
        choices[str(alpha)] = {"short": round(short, 4), "long": round(long, 4),
                               "kept": "short" if short >= long else "long"}
    return {"pairs": choices}, _png(fig)


def checkpoint_averaging(seed: int = 0) -> dict[str, Any]:
    """``average_checkpoints`` (§6.1) of three tiny models: one weight, each checkpoint's value and the mean."""
    config = build_config("tiny", 64)
    with tempfile.TemporaryDirectory() as tmp:
        paths, values = [], []
        for i in range(3):
            torch.manual_seed(seed + i)
            model = Transformer(config)
            values.append(float(model.encoder_layers[0].ffn.linear1.weight[0, 0].detach()))
            paths.append(Path(tmp) / f"checkpoint_{i + 1}.pt")
            save_checkpoint(paths[-1], model_checkpoint(model))
        averaged = average_checkpoints(paths)
    mean = float(averaged["model"]["encoder_layers.0.ffn.linear1.weight"][0, 0])
    return {"weight": "encoder_layers.0.ffn.linear1.weight[0, 0]", "values": [round(v, 6) for v in values],
            "average": round(mean, 6), "hand_mean": round(sum(values) / 3, 6)}


# Training against inference --------------------------------------------------------------------

def _trained(model_file: Path, tokenizer_file: Path) -> tuple[Transformer, Callable[[str], list[int]],
                                                               Callable[[int], str], Callable[[list[int]], str]]:
    from transformer import load_model
    from transformer.tokenizer import Tokenizer
    model = load_model(model_file)
    tokenizer = Tokenizer(tokenizer_file)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"{tokenizer_file} has {tokenizer.vocab_size} pieces, {model_file} a vocabulary of "
                         f"{model.config.vocab_size}: not the model's tokenizer")
    return (model, lambda text: tokenizer.encode([text])[0], tokenizer.sp.id_to_piece,
            lambda ids: tokenizer.decode([ids])[0])


def _random_model(seed: int = 0) -> tuple[Transformer, Callable[[str], list[int]], Callable[[int], str],
                                          Callable[[list[int]], str]]:
    """A tiny randomly initialised model whose "tokenizer" maps each word to an id (a stand-in)."""
    torch.manual_seed(seed)
    model = Transformer(build_config("tiny", 64))
    words: dict[str, int] = {}

    def encode(text: str) -> list[int]:
        return [words.setdefault(w, 4 + len(words) % 60) for w in text.split()]

    names = {PAD_ID: "<pad>", 1: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
    piece = lambda i: names.get(i, f"t{i}")  # noqa: E731
    return model, encode, piece, lambda ids: " ".join(piece(i) for i in ids)


def decoding(model_file: Path | None, tokenizer_file: Path | None, source: str = SOURCE,
             reference: str = REFERENCE, alpha: float = 0.6) -> tuple[dict[str, Any], bytes]:
    """One sentence decoded with teacher forcing (``Transformer.forward`` on BOS + reference, one pass:
    what training sees) and autoregressively (``greedy_search``, ``beam_search``: what inference does)."""
    trained = model_file is not None and tokenizer_file is not None
    model, encode, piece, detok = _trained(model_file, tokenizer_file) if trained else _random_model()
    model.eval()
    src_ids, gold = encode(source), encode(reference)
    limit = model.config.max_positions - 2
    src_ids, gold = src_ids[:limit], gold[:limit]
    src = torch.tensor([src_ids + [EOS_ID]])
    gold_out = gold + [EOS_ID]
    with torch.inference_mode():
        lprobs = torch.log_softmax(model(src, torch.tensor([[BOS_ID] + gold])).float(), dim=-1)[0]  # (T, V)
    forced = lprobs.argmax(-1).tolist()
    p_gold = lprobs.gather(1, torch.tensor(gold_out)[:, None]).exp().squeeze(1).tolist()
    max_len_b = 10
    greedy = greedy_search(model, src, max_len_b=max_len_b).hypotheses[0]
    beam = beam_search(model, src, beam_size=4, alpha=alpha, max_len_b=max_len_b).hypotheses[0]
    greedy_out = greedy + [EOS_ID]  # the search ends every hypothesis with EOS (forced at the length limit)
    show = lambda ids: [piece(i).replace("▁", "_") for i in ids]  # noqa: E731

    width = min(max(len(gold_out), len(greedy_out)), len(gold_out) + 3)  # a looping output is cut short
    fig, (table, bars) = plt.subplots(2, 1, figsize=(max(8.0, 0.95 * width + 2.5), 5.2),
                                      gridspec_kw={"height_ratios": [1.3, 1]})
    rows = [("teacher forcing: decoder input", show([BOS_ID] + gold), None),
            ("teacher forcing: prediction", show(forced), [f == g for f, g in zip(forced, gold_out)]),
            ("autoregressive: decoder input", show([BOS_ID] + greedy_out[:-1]), None),
            ("autoregressive: prediction", show(greedy_out),
             [i < len(gold_out) and t == gold_out[i] for i, t in enumerate(greedy_out)])]
    table.set_xlim(-0.5, width - 0.5)
    table.set_ylim(len(rows) - 0.5, -0.5)
    for r, (_, tokens, right) in enumerate(rows):
        for c, token in enumerate(tokens[:width]):
            if c == width - 1 and len(tokens) > width:
                token = "…"
            color = "black" if right is None else ("green" if right[c] else "red")
            table.text(c, r, token, ha="center", va="center", fontsize=7, color=color)
    table.set_yticks(range(len(rows)), [row[0] for row in rows], fontsize=8)
    table.set_xticks(range(width), [str(i + 1) for i in range(width)], fontsize=7)
    table.set_xlabel("target position (green: equals the reference token there)", fontsize=8)
    table.set_title(("trained model" if trained else "tiny RANDOMLY INITIALISED model (no trained model given)")
                    + f": '{source}'", fontsize=9)
    bars.bar(range(len(p_gold)), p_gold)
    bars.set_xticks(range(len(gold_out)), show(gold_out), rotation=60, fontsize=7)
    bars.set_xlim(-0.5, width - 0.5)
    bars.set_ylim(0, 1)
    bars.set_ylabel("P(reference token |\nreference prefix)", fontsize=8)
    fig.tight_layout()
    numbers = {
        "model": str(model_file) if trained else "tiny randomly initialised model (no trained model given)",
        "trained": trained, "source": source, "reference": reference,
        "source_pieces": show(src_ids + [EOS_ID]), "reference_pieces": show(gold_out),
        "teacher_forced_prediction": show(forced), "teacher_forced_correct": sum(
            f == g for f, g in zip(forced, gold_out)), "reference_length": len(gold_out),
        "p_reference": [round(p, 4) for p in p_gold],
        "greedy_pieces": show(greedy_out), "greedy_text": detok(greedy), "beam_alpha": alpha,
        "beam4_text": detok(beam), "decoder_passes": {"teacher_forcing": 1, "greedy": len(greedy_out)},
        "first_position_agrees": forced[0] == greedy_out[0],
    }
    return numbers, _png(fig)


# Output -----------------------------------------------------------------------------------------

def _md_matrix(rows: list[list[float]], row_labels: list[str], col_labels: list[str], digits: int = 3) -> str:
    head = "| | " + " | ".join(col_labels) + " |\n|---|" + "---:|" * len(col_labels) + "\n"
    return head + "".join(f"| {label} | " + " | ".join(f"{v:.{digits}f}" for v in row) + " |\n"
                          for label, row in zip(row_labels, rows))


def markdown(n: dict[str, Any]) -> str:
    """The worked numbers as tables (``worked_numbers.md``)."""
    a, s, lr, d = n["attention"], n["label_smoothing"], n["learning_rate"], n["decoding"]
    t = ATTENTION_TOKENS
    out = ["# Worked numbers", "",
           "Generated by `python -m pipeline.figures.paper_figures` (`make docs`) from the package's own functions; "
           "explained in [../paper.md](../paper.md).", "",
           "## Embeddings (§3.4) and positional encoding (§3.5)", "",
           f"sqrt(d_model) = {n['embedding']['scale']} for d_model {n['embedding']['d_model']} "
           f"(sqrt(512) = {n['embedding']['sqrt_512']}). Token rows at initialisation: std "
           f"{n['embedding']['row_std_before']}; times sqrt(d_model): {n['embedding']['row_std_after']}; "
           f"positional encodings: std {n['embedding']['positional_std']}.", "",
           "PE, d_model 512, first four dimensions:", "",
           _md_matrix([n["positional"][f"pe_pos{i}_first4"] for i in range(3)], ["pos 0", "pos 1", "pos 2"],
                      ["i=0 (sin)", "i=1 (cos)", "i=2 (sin)", "i=3 (cos)"], 4),
           "## Scaled dot-product attention (§3.2.1, eq. 1), 3 tokens, d_k = 4", ""]
    for name in ("Q", "K", "V"):
        out += [f"{name}:", "", _md_matrix(a[name], t, ["1", "2", "3", "4"], 1)]
    out += ["scores = QK^T / sqrt(4):", "", _md_matrix(a["scores"], t, t, 2),
            "weights = softmax(scores), by row:", "", _md_matrix(a["weights"], t, t, 3),
            "output = weights V:", "", _md_matrix(a["output"], t, ["1", "2", "3", "4"], 3),
            f"Largest difference from the hand computation: {a['max_difference_from_hand']:.1e}.", "",
            "## Label smoothing (§5.4), 6-word vocabulary, eps = 0.1", "",
            _md_matrix([s["target"], s["model_probs"]], ["smoothed target", "model softmax"], s["vocab"], 4),
            f"Target sum {s['target_sum']}; loss from `label_smoothed_cross_entropy` {s['loss_code']}, "
            f"by hand {s['loss_by_hand']}; plain NLL {s['nll']}.", "",
            "## Learning rate (§5.3, eq. 3)", "",
            "| schedule | d_model | warm-up | scale | peak step | peak rate | eq. 3 at warm-up | rate at last step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, c in lr["curves"].items():
        out.append(f"| {name} | {c['d_model']} | {c['warmup_steps']} | {c['scale']} | {c['peak_step']} | "
                   f"{c['peak_lr']:.3e} | {c['eq3_peak']:.3e} | {c['lr_at_end']:.3e} (step {c['steps']}) |")
    out += ["", "## Teacher forcing against autoregressive decoding", "",
            f"Model: {d['model']}.", "", f"Source: {d['source']}", "", f"Reference: {d['reference']}", "",
            "| target position | " + " | ".join(str(i + 1) for i in range(len(d["reference_pieces"]))) + " |",
            "|---|" + "---|" * len(d["reference_pieces"]),
            "| reference | " + " | ".join(f"`{p}`" for p in d["reference_pieces"]) + " |",
            "| teacher-forced prediction | " + " | ".join(f"`{p}`" for p in d["teacher_forced_prediction"]) + " |",
            "| P(reference token) | " + " | ".join(f"{p:.2f}" for p in d["p_reference"]) + " |", "",
            f"Teacher forcing: {d['teacher_forced_correct']} of {d['reference_length']} positions predict the "
            "reference token, all in one decoder pass.", "",
            f"Greedy: {d['greedy_text']}", "", f"Beam 4, alpha {d['beam_alpha']}: {d['beam4_text']}", ""]
    return "\n".join(out)


def generate(out_dir: str | Path, model_file: str | Path | None = None,
             tokenizer_file: str | Path | None = None, repo_schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write every figure, ``worked_numbers.json`` and ``worked_numbers.md`` into ``out_dir``; returns the numbers."""
    if (model_file is None) != (tokenizer_file is None):
        raise ValueError("give both --model and --tokenizer, or neither")
    out_dir = Path(out_dir)
    numbers: dict[str, Any] = {}
    images: dict[str, bytes] = {}
    torch.manual_seed(0)
    tiny = Transformer(build_config("tiny", 64)).eval()
    numbers["embedding"] = embedding_scale(tiny)
    numbers["positional"], images["positional_encoding.png"] = positional_encoding()
    numbers["masks"], images["masks.png"] = masks(tiny)
    numbers["attention"], images["attention_worked.png"] = attention_worked()
    numbers["multi_head"], images["multi_head_attention.png"] = multi_head()
    numbers["residual"], images["residual_norms.png"] = residual_norms()
    numbers["feed_forward"] = feed_forward()
    numbers["stacks"] = stacks()
    numbers["label_smoothing"], images["label_smoothing.png"] = regularisation()
    numbers["learning_rate"], images["learning_rate.png"] = learning_rate(repo_schedule or REPO_SCHEDULE)
    numbers["length_penalty"], images["length_penalty.png"] = length_penalty_example()
    numbers["checkpoint_averaging"] = checkpoint_averaging()
    numbers["decoding"], images["decoding.png"] = decoding(
        Path(model_file) if model_file else None, Path(tokenizer_file) if tokenizer_file else None)
    for name, data in images.items():
        write_bytes(out_dir / name, data)
    write_json(out_dir / "worked_numbers.json", numbers)
    write_text(out_dir / "worked_numbers.md", markdown(numbers))
    return numbers


def repo_schedule(params_file: Path) -> dict[str, Any]:
    """This repository's default schedule from ``params_file`` (d_model of the model preset, warm-up, scale,
    and its length, ``train.max_steps``, where set)."""
    from pipeline.config.params import load_params
    params = load_params(params_file)
    config = params.model.config(params.tokenizer.vocab_size)
    return {"d_model": config.d_model, "warmup_steps": params.train.warmup_steps, "scale": params.train.lr_scale,
            "steps": params.train.max_steps or REPO_SCHEDULE["steps"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/figures", help="folder for the PNGs and worked numbers")
    parser.add_argument("--model", help="a trained model (models/model.pt); else a tiny random model is used")
    parser.add_argument("--tokenizer", help="its SentencePiece model (data/tokenizer/spm.model)")
    parser.add_argument("--params", default="params.yaml",
                        help="read the default learning-rate schedule from here (when it exists)")
    args = parser.parse_args(argv)
    try:
        schedule = repo_schedule(Path(args.params)) if Path(args.params).is_file() else None
        numbers = generate(args.out, args.model, args.tokenizer, schedule)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {len(FIGURES)} figures, worked_numbers.json and worked_numbers.md to {args.out} "
          f"(decoding example: {numbers['decoding']['model']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
