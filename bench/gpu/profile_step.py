"""Where a training step's time goes on the GPU: the base preset's steps timed one by one and profiled.

The GPU campaign's first run (docs/gpu.md) measured ``base`` and ``big`` at about the same target
tokens per second (~60k), and ``torch.nn.Transformer`` too: a cost per step that does not scale
with the model. This script separates the candidates on the same batches as
``bench/train_throughput.py`` (the token store's, our model, bf16 autocast, fused Adam):

1. steps over batches of changing shapes (as the trainer and the bench run), each timed alone;
2. the same batch repeated (one shape: the caching allocator and the kernels' choices settle);
3. one step split into forward (to the decoder's states), loss (the output projection fused into it,
   its gradients included, as the trainer runs it), backward and optimizer (synchronised between them);
4. ``torch.profiler`` over a few changing-shape steps: the operators taking the most GPU and CPU time.

    python -m bench.gpu.profile_step --token-store .gpu/wmt14/train [--device cuda] [--steps 8]
                                     [--d-model N --layers N ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.train_throughput import SHAPES, Work, _sync, prepare, store_batches
from transformer import PAD_ID, Transformer, build_config
from transformer.precision import autocast
from transformer.training.loss import projected_label_smoothed_cross_entropy
from transformer.training.schedule import make_optimizer
from transformer.training.token_store import TokenStore


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, w: Work, device: torch.device,
         split: bool = False) -> dict[str, float]:
    """One update; with ``split`` the seconds of each part (synchronised), else of the whole."""
    marks = [time.perf_counter()]

    def mark() -> None:
        if split:
            _sync(device)
            marks.append(time.perf_counter())

    with autocast("bf16", device):
        hidden = model(w.batch.src, w.batch.tgt_in, project=False)
        mark()
        # The trainer's loss: the output projection, the loss and their gradients, chunk by chunk.
        out = projected_label_smoothed_cross_entropy(hidden, model.output.weight, w.batch.tgt_out, PAD_ID, 0.1)
    mark()
    (out.loss / w.target_tokens).backward()
    mark()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    marks.append(time.perf_counter())
    if split:
        names = ("forward", "loss", "backward", "optimizer")
        return {n: 1000 * (b - a) for n, a, b in zip(names, marks, marks[1:])}
    return {"step": 1000 * (marks[-1] - marks[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--token-store", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="base", choices=sorted(SHAPES))
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--steps", type=int, default=8)
    for name in ("d_model", "heads", "d_ff", "layers"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = dataclasses.replace(SHAPES[args.preset], **{k: getattr(args, k) for k in ("d_model", "heads", "d_ff",
                                                                                        "layers")
                                                         if getattr(args, k) is not None})
    shape = dataclasses.replace(shape, vocab=TokenStore(args.token_store).vocab_size)
    work = prepare(store_batches(args.token_store, args.max_tokens or shape.max_tokens), shape, device)
    config = build_config(shape.preset, shape.vocab, d_model=shape.d_model, n_heads=shape.heads, d_ff=shape.d_ff,
                          n_encoder_layers=shape.layers, n_decoder_layers=shape.layers, dropout=shape.dropout)
    model = Transformer(config).to(device).train()
    opt = make_optimizer(model.parameters(), fused=device.type == "cuda")
    print(f"{shape.preset} on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), "
          f"torch {torch.__version__}, {len(work)} batches, {shape.max_tokens} tokens a batch", flush=True)
    for w in work[:3]:
        step(model, opt, w, device)

    def report(label: str, times: list[float], ws: list[Work]) -> None:
        tokens = sum(w.target_tokens for w in ws)
        print(f"{label}: ms a step {[round(t) for t in times]}, median {statistics.median(times):.1f}; "
              f"{tokens / (sum(times) / 1000):,.0f} target tokens/s", flush=True)

    changing = work[3:3 + args.steps]
    report("1. changing shapes", [step(model, opt, w, device)["step"] for w in changing], changing)
    same = [work[3]] * args.steps
    report("2. one batch repeated", [step(model, opt, w, device)["step"] for w in same], same)
    parts = [step(model, opt, w, device, split=True) for w in changing[:4]]
    print("3. one step in parts (ms, median of 4): " + ", ".join(
        f"{k} {statistics.median(p[k] for p in parts):.1f}" for k in parts[0]), flush=True)
    if device.type == "cuda":
        print(f"   memory: allocated {torch.cuda.memory_allocated() / 2**30:.2f} GiB, reserved "
              f"{torch.cuda.memory_reserved() / 2**30:.2f} GiB, cudaMalloc retries "
              f"{torch.cuda.memory_stats().get('num_alloc_retries', 0)}, device mallocs "
              f"{torch.cuda.memory_stats().get('num_device_alloc', 'n/a')}", flush=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for w in (work[3 + args.steps:][:3] or work[:3]):   # shapes not seen by the steps above
            step(model, opt, w, device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"4. profiler, 3 steps, by {sort}:")
    print(prof.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=55))
    if device.type == "cuda":
        print("   by self_cpu_time_total:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=55))


if __name__ == "__main__":
    main()
