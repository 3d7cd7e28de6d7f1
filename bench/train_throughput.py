"""Training throughput: this package against a torch.nn.Transformer reference (fp32, eager).

Both train the same shape (d_model 256, 3+3 layers, 4 heads, d_ff 1024, 8000 shared
vocabulary) on the same synthetic Multi30k-like batches (4096 padded tokens), in interleaved
rounds; the last line is ``ratio=<ours / reference>`` of the median target tokens per second.

    python bench/train_throughput.py [--steps 20] [--rounds 5] [--precision bf16] [--compile]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from torch import nn

from transformer import PAD_ID, Transformer, build_config
from transformer.data import Batch, TokenBatchSampler
from transformer.loss import label_smoothed_cross_entropy
from transformer.precision import autocast
from transformer.schedule import make_optimizer, make_scheduler

VOCAB, D_MODEL, HEADS, D_FF, LAYERS = 8000, 256, 4, 1024, 3


def synthetic_batches(n_pairs: int, max_tokens: int, seed: int = 0) -> list[Batch]:
    """Pairs with Multi30k's length profile (about 14 source and 15 target pieces)."""
    rng = np.random.default_rng(seed)
    src_len = np.clip(rng.normal(14, 5, n_pairs).astype(int), 3, 60)
    tgt_len = np.clip((src_len * rng.normal(1.1, 0.15, n_pairs)).astype(int), 3, 70)
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, seed=seed)
    batches = []
    for idx in sampler.batches(0):
        s, t = src_len[idx].max() + 1, tgt_len[idx].max() + 1
        src = torch.randint(4, VOCAB, (len(idx), s))
        tgt = torch.randint(4, VOCAB, (len(idx), t + 1))
        for row, i in enumerate(idx):
            src[row, src_len[i] + 1:] = PAD_ID
            tgt[row, tgt_len[i] + 2:] = PAD_ID
        batches.append(Batch(src, tgt[:, :-1], tgt[:, 1:]))
    return batches


class Reference(nn.Module):
    """The reference: torch.nn.Transformer with embeddings, sinusoids and a tied projection."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=PAD_ID)
        self.core = nn.Transformer(D_MODEL, HEADS, LAYERS, LAYERS, D_FF, dropout=0.1, batch_first=True)
        self.out = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.out.weight = self.embed.weight
        pos = torch.arange(512)[:, None] * torch.exp(torch.arange(0, D_MODEL, 2) * (-math.log(1e4) / D_MODEL))
        pe = torch.zeros(512, D_MODEL)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        e = lambda x: self.embed(x) * math.sqrt(D_MODEL) + self.pe[: x.size(1)]
        mask = self.core.generate_square_subsequent_mask(tgt.size(1))
        h = self.core(e(src), e(tgt), tgt_mask=mask, src_key_padding_mask=src == PAD_ID,
                      tgt_key_padding_mask=tgt == PAD_ID, memory_key_padding_mask=src == PAD_ID)
        return self.out(h)


def throughput(model: nn.Module, batches: list[Batch], precision: str, steps: int, warmup: int,
               fused: bool) -> float:
    """Target tokens per second over ``steps`` updates after ``warmup`` untimed ones."""
    device = torch.device("cpu")
    opt = make_optimizer(model.parameters(), fused=fused)
    sched = make_scheduler(opt, D_MODEL, 4000)
    model.train()
    tokens, start = 0, 0.0
    for i in range(warmup + steps):
        if i == warmup:
            tokens, start = 0, time.perf_counter()
        b = batches[i % len(batches)]
        with autocast(precision, device):
            logits = model(b.src, b.tgt_in)
        out = label_smoothed_cross_entropy(logits, b.tgt_out, PAD_ID, 0.1)
        (out.loss / out.n_tokens).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tokens += b.n_target_tokens
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed updates per round and model")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (reference, ours), interleaved so that a slow spell of a shared "
                             "machine hits both; the ratio is of the medians (ours' rounds on the same "
                             "batches spread by up to 30%% on this machine, so 3 were too few)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args()
    torch.manual_seed(0)
    batches = synthetic_batches(4000, args.max_tokens)
    reference = Reference()
    config = build_config("small", VOCAB, n_heads=HEADS, d_ff=D_FF, dropout=0.1)
    model: nn.Module = Transformer(config)
    if args.compile:
        t0 = time.perf_counter()
        model = torch.compile(model, dynamic=True)
        throughput(model, batches, args.precision, 1, 2, fused=True)
        print(f"torch.compile warm-up: {time.perf_counter() - t0:.1f} s")
    refs, ours = [], []
    for r in range(args.rounds):
        window = batches[r * args.steps:] + batches[:r * args.steps]  # the same batches for both models
        refs.append(throughput(reference, window, "fp32", args.steps, args.warmup, fused=False))
        ours.append(throughput(model, window, args.precision, args.steps, args.warmup, fused=True))
        print(f"round {r + 1}: reference {refs[-1]:,.0f}, ours {ours[-1]:,.0f} target tokens/s", flush=True)
    ref, our = float(np.median(refs)), float(np.median(ours))
    print(f"reference torch.nn.Transformer fp32 eager: {ref:,.0f} target tokens/s (median of {args.rounds})")
    label = f"{args.precision}{' compiled' if args.compile else ' eager'}, fused Adam, explicit attention on CPU"
    print(f"transformer package {label}: {our:,.0f} target tokens/s (median of {args.rounds})")
    print(f"ratio={our / ref:.2f}")


if __name__ == "__main__":
    main()
