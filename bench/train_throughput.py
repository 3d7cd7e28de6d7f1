"""Training throughput and model FLOPs utilisation: this package against a torch.nn.Transformer reference.

Both train the same shape on the same synthetic batches, in interleaved rounds:

- ``--preset default`` (default): the model and ``train.max_tokens`` of ``params.yaml``, the
  configuration ``make run`` trains, on Multi30k-like batches;
- ``--preset small``: the ``small`` preset (d_model 256, 3+3 layers, 4 heads, d_ff 1024, 8000 shared vocabulary)
  on Multi30k-like batches of 4096 padded tokens (about 14 source and 15 target pieces a sentence);
- ``--preset base`` (Table 3: d_model 512, 6+6 layers, 8 heads, d_ff 2048, 37000 shared BPE
  vocabulary as for WMT En-De, §5.1) on WMT-like batches of ~25000 padded tokens (§5.1; sentences
  about twice Multi30k's, ~27 pieces);
- ``--preset big`` (Table 3: d_model 1024, 16 heads, d_ff 4096, dropout 0.3) on the same batches.

``--token-store DIR`` cuts the batches from a real token store (the tokenizer stage's
``data/tokens/train``, e.g. of a WMT14-shaped corpus) with the trainer's own sampler and collate,
cycled when a run needs more batches than the store holds; the vocabulary is then the store's.
Otherwise the batches are synthetic, with the preset's length profile.

The reference trains as ours does on every device: the same autocast (bf16 where ``auto`` resolves
to it), the same fused Adam and schedule, its natural loss (the logits made whole, then the same
label-smoothed cross-entropy), and with ``--compile`` compiled too; ``ratio=`` compares like with
like. ``--fp32-reference`` times it a second time in fp32 in the same rounds and prints that line,
labelled, and ``fp32_reference_ratio=`` (what the bench printed as its ratio on CPU before: mostly
bf16 against fp32, not our code against theirs).

MFU (model FLOPs utilisation) = the matrix-product FLOPs of each step (``step_flops``) per second,
over the device's dense peak: on CUDA the data-sheet bf16 peak of the GPU (``GPU_PEAK_TFLOPS``,
measured when the GPU is not in the table), on CPU the matrix-product peak measured in the same
run (in every round, the best kept) in the training precision. On CUDA the bf16 peak is also
measured in the same run (an 8192^3 product) and MFU printed against both; with it the peak GPU
memory of each model's training. The last lines are ``mfu=<ours>`` and ``ratio=<ours / reference>``
of the median target tokens per second (``--no-reference``: no reference, no ratio).

Ours trains as the trainer does, the output projection fused into the loss
(``transformer.training.loss.projected_label_smoothed_cross_entropy``); ``--unfused-loss`` times it a second
time in the same rounds with the logits made whole and the loss after them, and prints
``fused_loss_ratio=<fused / unfused>``.

``--static-compile`` measures what compiling on bucketed, static widths could give at best: ours
compiled with static shapes (``dynamic=False``) against ours eager, both on one repeated batch of the
median width (so the compiled step never recompiles: a real run would pay a compilation per distinct
width pair), in the same rounds; it prints the compilation's seconds and ``static_compile_ratio=``.

    python bench/train_throughput.py [--steps 20] [--rounds 5] [--precision auto] [--compile] [--static-compile]
                                     [--device cpu|cuda] [--preset default|small|base|big] [--max-tokens N]
                                     [--token-store DIR] [--no-reference] [--unfused-loss] [--d-model N --layers N ...]

``--precision auto`` (default) is what ``train.precision: auto`` resolves to on the device: bf16
where it has fast bf16 products (AVX512-BF16/AMX CPU, GPU), else fp32.

The bench runs on the C allocator the train stage chooses (``pipeline/stages/malloc.py``: tcmalloc where
installed; ``PIPELINE_MALLOC=system`` for the process as started), both models alike, and names it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from transformer import PAD_ID, Transformer, build_config
from transformer.precision import autocast, resolve_precision
from transformer.training.batching import Batch, TokenBatchSampler, collate
from transformer.training.loss import LossOutput, label_smoothed_cross_entropy, projected_label_smoothed_cross_entropy
from transformer.training.schedule import make_optimizer, make_scheduler
from transformer.training.token_store import TokenStore

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@dataclass(frozen=True)
class Shape:
    """A model shape and the batches it trains on."""

    preset: str
    vocab: int
    d_model: int
    heads: int
    d_ff: int
    layers: int
    max_tokens: int  # padded tokens per batch (the longer side)
    mean_len: float  # mean source length in pieces
    n_pairs: int  # synthetic sentence pairs to cut into batches
    dropout: float = 0.1


def params_shape(path: Path = PARAMS) -> Shape:
    """The shape ``make run`` trains: params.yaml's model (preset plus overrides), its tokenizer's
    vocabulary size and ``train.max_tokens``, on Multi30k-like lengths."""
    from pipeline.config.params import load_params  # bench-only: the package itself never reads params.yaml

    params = load_params(path)
    config = params.model.config(params.tokenizer.vocab_size)
    if config.n_encoder_layers != config.n_decoder_layers:
        raise SystemExit(f"{path}: the bench needs as many encoder as decoder layers")
    return Shape(params.model.preset, config.vocab_size, config.d_model, config.n_heads, config.d_ff,
                 config.n_encoder_layers, params.train.max_tokens, 14.0, 4000, config.dropout)


SHAPES = {
    "small": Shape("small", 8000, 256, 4, 1024, 3, 4096, 14.0, 4000),
    "base": Shape("base", 37000, 512, 8, 2048, 6, 25000, 27.0, 80000),
    "big": Shape("big", 37000, 1024, 16, 4096, 6, 25000, 27.0, 80000, dropout=0.3),
}
SMALL = SHAPES["small"]
CPU = torch.device("cpu")
VOCAB, D_MODEL, HEADS, D_FF, LAYERS = SMALL.vocab, SMALL.d_model, SMALL.heads, SMALL.d_ff, SMALL.layers

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s; first match on
# torch.cuda.get_device_name() wins. "NVIDIA H100 80GB HBM3" is the SXM part. A GPU not listed
# (an H100 NVL, say) gets a measured peak instead of a wrong row.
GPU_PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"H100.*PCIe", "H100 PCIe", 756.0),
    (r"H100.*(HBM3|SXM)", "H100 SXM", 989.0),
    (r"H200(?!.*NVL)", "H200", 989.0),
    (r"A100", "A100", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"\bL4\b", "L4", 121.0),
)


def synthetic_batches(n_pairs: int, max_tokens: int, seed: int = 0, mean_len: float = 14.0,
                      vocab: int = VOCAB) -> list[Batch]:
    """Random pairs with a translation length profile: source ~ N(mean_len, 0.36 mean_len) pieces
    (Multi30k: 14 +- 5), target 1.1 +- 0.15 times longer, cut into length-sorted batches."""
    rng = np.random.default_rng(seed)
    scale = mean_len / 14.0
    src_len = np.clip(rng.normal(mean_len, 5 * scale, n_pairs).astype(int), 3, int(60 * scale))
    tgt_len = np.clip((src_len * rng.normal(1.1, 0.15, n_pairs)).astype(int), 3, int(70 * scale))
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, seed=seed)
    batches = []
    for idx in sampler.batches(0):
        s, t = src_len[idx].max() + 1, tgt_len[idx].max() + 1
        src = torch.randint(4, vocab, (len(idx), s))
        tgt = torch.randint(4, vocab, (len(idx), t + 1))
        # Pad after EOS (source) and after BOS + target + EOS (target), as collate does.
        src[torch.arange(s)[None, :] > torch.from_numpy(src_len[idx])[:, None]] = PAD_ID
        tgt[torch.arange(t + 1)[None, :] > torch.from_numpy(tgt_len[idx])[:, None] + 1] = PAD_ID
        batches.append(Batch(src, tgt[:, :-1], tgt[:, 1:]))
    return batches


def store_batches(path: Path, max_tokens: int, seed: int = 0) -> list[Batch]:
    """One epoch of the trainer's batches (``TokenBatchSampler``, ``collate``) of the token store at ``path``."""
    store = TokenStore(path)
    sampler = TokenBatchSampler(store.lengths["src"], store.lengths["tgt"], max_tokens, seed=seed)
    return [collate(store, idx) for idx in sampler.batches(0)]


def step_flops(src_len: int, tgt_len: int, rows: int, shape: Shape) -> int:
    """Matrix-product FLOPs of one training step on a padded (rows x src_len, rows x tgt_len) batch:
    3x the forward's (the backward computes two products per forward one: input and weight gradients).

    Forward, with B rows, S source and T target positions, d = d_model (§3):
    encoder layer 8BSd^2 (Q, K, V, output projections) + 4BS^2d (QK^T, weights V) + 4BSd d_ff (§3.3);
    decoder layer 8BTd^2 + 4BT^2d (self-attention: all T x T scores, as the explicit path computes
    them) + 4BTd^2 + 4BSd^2 + 4BTSd (encoder-decoder attention) + 4BTd d_ff; output 2BTdV (§3.4).
    Padding counts: it is work the device does. Elementwise work (softmax, layer norm) is left out.
    """
    b, s, t, d = rows, src_len, tgt_len, shape.d_model
    encoder = 8 * b * s * d * d + 4 * b * s * s * d + 4 * b * s * d * shape.d_ff
    decoder = (8 * b * t * d * d + 4 * b * t * t * d + 4 * b * t * d * d + 4 * b * s * d * d
               + 4 * b * t * s * d + 4 * b * t * d * shape.d_ff)
    return 3 * (shape.layers * (encoder + decoder) + 2 * b * t * d * shape.vocab)


class Reference(nn.Module):
    """The reference: torch.nn.Transformer with embeddings, sinusoids and a tied projection."""

    def __init__(self, shape: Shape = SMALL) -> None:
        super().__init__()
        d = shape.d_model
        self.d_model = d
        self.embed = nn.Embedding(shape.vocab, d, padding_idx=PAD_ID)
        self.core = nn.Transformer(d, shape.heads, shape.layers, shape.layers, shape.d_ff, dropout=shape.dropout,
                                   batch_first=True)
        self.out = nn.Linear(d, shape.vocab, bias=False)
        self.out.weight = self.embed.weight
        pos = torch.arange(512)[:, None] * torch.exp(torch.arange(0, d, 2) * (-math.log(1e4) / d))
        pe = torch.zeros(512, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        e = lambda x: self.embed(x) * math.sqrt(self.d_model) + self.pe[: x.size(1)]
        mask = self.core.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        h = self.core(e(src), e(tgt), tgt_mask=mask, src_key_padding_mask=src == PAD_ID,
                      tgt_key_padding_mask=tgt == PAD_ID, memory_key_padding_mask=src == PAD_ID)
        return self.out(h)


@dataclass
class Work:
    """A batch on the training device with what is counted of it (computed once, on the host)."""

    batch: Batch
    target_tokens: int
    flops: int


def prepare(batches: list[Batch], shape: Shape, device: torch.device) -> list[Work]:
    return [Work(b.to(device), b.n_target_tokens, step_flops(b.src.size(1), b.tgt_in.size(1), b.src.size(0), shape))
            for b in batches]


def peak_memory(device: torch.device) -> int:
    """Bytes: the most the caching allocator held for tensors since the last reset (0 off CUDA)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_loss(model: nn.Module, batch: Batch, precision: str, device: torch.device,
               fused_loss: bool = True) -> LossOutput:
    """The trainer's loss for ours (the output projection fused into it, ``transformer.training.trainer``),
    the plain label-smoothed loss over the logits for the reference (and for ours without ``fused_loss``)."""
    core = getattr(model, "_orig_mod", model)  # ours under torch.compile
    with autocast(precision, device):
        if fused_loss and isinstance(core, Transformer):
            hidden = model(batch.src, batch.tgt_in, project=False)
            return projected_label_smoothed_cross_entropy(hidden, core.output.weight, batch.tgt_out, PAD_ID, 0.1,
                                                          n_tokens=batch.n_target_tokens)
        logits = model(batch.src, batch.tgt_in)
    return label_smoothed_cross_entropy(logits, batch.tgt_out, PAD_ID, 0.1)


def throughput(model: nn.Module, work: list[Work], precision: str, steps: int, warmup: int, fused: bool,
               d_model: int = D_MODEL, device: torch.device = CPU, fused_loss: bool = True) -> tuple[float, float]:
    """(target tokens per second, matrix-product FLOP/s) over ``steps`` updates after ``warmup`` untimed ones."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    opt = make_optimizer(model.parameters(), fused=fused)
    sched = make_scheduler(opt, d_model, 4000)
    model.train()
    tokens, flops, start = 0, 0, 0.0
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            tokens, flops, start = 0, 0, time.perf_counter()
        w = work[i % len(work)]
        out = batch_loss(model, w.batch, precision, device, fused_loss)
        (out.loss / w.target_tokens).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        del out  # the reference's base batch's logits are GBs: free them before the next forward
        tokens += w.target_tokens
        flops += w.flops
    _sync(device)
    seconds = time.perf_counter() - start
    return tokens / seconds, flops / seconds


def measure_matmul_peak(device: torch.device, dtype: torch.dtype, shapes: list[tuple[int, int, int]],
                        budget_s: float = 1.5) -> tuple[float, str]:
    """Best over ``shapes`` (m, k, n) of the median FLOP/s of (m x k) @ (k x n) in ``dtype``; and how it
    was measured. Shapes run smallest first; one whose first product would take over ``budget_s`` at
    the best rate so far is skipped (on a CPU without bf16 units a 2048^3 bf16 product takes a minute)."""
    best, notes = 0.0, []
    for m, k, n in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
        flop = 2 * m * k * n
        label = f"{m}x{k}x{n}"
        if best and 2 * flop / best > budget_s:  # its warm-up and first timing
            notes.append(f"{label} skipped (> {budget_s:g} s)")
            continue
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        torch.matmul(a, b)  # warm-up: library initialisation, kernel choice, page faults
        _sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        reps = max(3, min(25, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            _sync(device)
            rates.append(flop / (time.perf_counter() - t0))
        rate = statistics.median(rates)
        best = max(best, rate)
        notes.append(f"{label} {_flops_text(rate, device)} (median of {reps})")
    return best, ", ".join(notes)


def _flops_text(rate: float, device: torch.device) -> str:
    value, unit = (rate / 1e12, "TFLOP/s") if device.type == "cuda" else (rate / 1e9, "GFLOP/s")
    return f"{value:,.{0 if value >= 100 else 1 if value >= 10 else 2}f} {unit}"


def gpu_peak(device: torch.device) -> tuple[float, str]:
    """(dense bf16 peak FLOP/s of this GPU, its description): the data sheet's, else measured."""
    name = torch.cuda.get_device_name(device)
    for pattern, label, tflops in GPU_PEAK_TFLOPS:
        if re.search(pattern, name, re.IGNORECASE):
            return tflops * 1e12, f"{label} dense bf16 peak {tflops:,.0f} TFLOP/s, data sheet; {name}"
    peak, how = measure_matmul_peak(device, torch.bfloat16, [(8192, 8192, 8192)])
    return peak, f"measured bf16 peak {_flops_text(peak, device)} on {name}: {how}"


def static_compile_pair(config, work: list[Work], precision: str, shape: Shape,
                        device: torch.device) -> tuple[nn.Module, nn.Module, list[Work]]:
    """(ours eager, the same weights compiled with static shapes, one batch of the median width) for
    ``--static-compile``; the compilation's seconds are printed."""
    one = [sorted(work, key=lambda w: w.batch.src.size(1) + w.batch.tgt_in.size(1))[len(work) // 2]]
    eager = Transformer(config).to(device)
    compiled_copy = Transformer(config).to(device)
    compiled_copy.load_state_dict(eager.state_dict())
    start = time.perf_counter()
    compiled = torch.compile(compiled_copy, dynamic=False)
    throughput(compiled, one, precision, 1, 2, fused=True, d_model=shape.d_model, device=device)
    print(f"torch.compile with static shapes, one batch width: {time.perf_counter() - start:.1f} s "
          f"({len({(w.batch.src.shape, w.batch.tgt_in.shape) for w in work})} distinct batch shapes among "
          f"the {len(work)} batches)", flush=True)
    return eager, compiled, one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="timed updates per round and model")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (reference, ours), interleaved so that a slow spell of a shared "
                             "machine hits both; the ratio is of the medians (ours' rounds on the same "
                             "batches spread by up to 30%% on this machine, so 3 were too few)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile ours (CPU) or both models (CUDA)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="default", choices=["default", *sorted(SHAPES)],
                        help="default: params.yaml's model and train.max_tokens")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="padded tokens per batch (default: params.yaml's; 4096 small, 25000 base and big)")
    parser.add_argument("--token-store", type=Path, default=None,
                        help="cut the batches from this token store (its vocabulary replaces the preset's)")
    parser.add_argument("--no-reference", dest="reference", action="store_false",
                        help="time ours only (no torch.nn.Transformer, no ratio)")
    parser.add_argument("--fp32-reference", action="store_true",
                        help="also time the reference in fp32 (labelled; the ratio stays the same-precision one)")
    parser.add_argument("--unfused-loss", action="store_true",
                        help="also time ours with the logits made whole and the loss after them (the trainer "
                             "before the projection was fused into the loss), in the same rounds")
    parser.add_argument("--static-compile", action="store_true",
                        help="also time ours compiled with static shapes against ours eager, both on one "
                             "repeated batch of the median width, in the same rounds (the best a compiled "
                             "step on bucketed widths could do)")
    for name in ("d_model", "heads", "d_ff", "layers"):   # a smaller shape of the preset (rehearsals)
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override the preset's {name}")
    args = parser.parse_args()
    from pipeline.stages.malloc import restart_on_chosen_malloc

    restart_on_chosen_malloc()   # as the train stage runs: both models on the same allocator
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but no GPU is visible")
    shape = params_shape() if args.preset == "default" else SHAPES[args.preset]
    shape = dataclasses.replace(shape, **{k: getattr(args, k) for k in ("d_model", "heads", "d_ff", "layers")
                                          if getattr(args, k) is not None})
    args.precision = resolve_precision(args.precision, device)
    torch.manual_seed(0)
    max_tokens = args.max_tokens or shape.max_tokens
    if args.token_store is not None:
        batches = store_batches(args.token_store, max_tokens)
        shape = dataclasses.replace(shape, vocab=TokenStore(args.token_store).vocab_size)
        pairs = sum(b.src.size(0) for b in batches)
        print(f"batches: {len(batches)} from the token store {args.token_store} ({pairs:,} pairs, vocabulary "
              f"{shape.vocab}), cycled", flush=True)
    else:
        batches = synthetic_batches(shape.n_pairs, max_tokens, mean_len=shape.mean_len, vocab=shape.vocab)
    work = prepare(batches, shape, device)
    reference: nn.Module | None = Reference(shape).to(device) if args.reference else None
    config = build_config(shape.preset, shape.vocab, d_model=shape.d_model, n_heads=shape.heads, d_ff=shape.d_ff,
                          n_encoder_layers=shape.layers, n_decoder_layers=shape.layers, dropout=shape.dropout)
    model: nn.Module = Transformer(config).to(device)
    # Like with like: the reference gets our precision, optimizer and (with --compile) compilation.
    on_gpu = device.type == "cuda"
    ref_precision = args.precision
    if args.compile:
        for name in ("ours", "reference") if reference is not None else ("ours",):
            t0 = time.perf_counter()
            module = torch.compile(model if name == "ours" else reference, dynamic=True)
            throughput(module, work, args.precision, 1, 2, fused=True, d_model=shape.d_model, device=device)
            print(f"torch.compile warm-up ({name}): {time.perf_counter() - t0:.1f} s", flush=True)
            model, reference = (module, reference) if name == "ours" else (model, module)
    static: tuple[nn.Module, nn.Module, list[Work]] | None = None
    if args.static_compile:
        static = static_compile_pair(config, work, args.precision, shape, device)
    # A CPU's peak is measured in every round, in the training precision, and the best kept: a slow
    # spell of a shared machine during one measurement would otherwise lower the peak and raise MFU.
    peak_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    refs, refs32, ours, unfused, peaks, one_eager, one_static = [], [], [], [], [], [], []
    memory = {"reference": 0, "ours": 0}
    for r in range(args.rounds):
        window = work[r * args.steps:] + work[:r * args.steps]  # the same batches for both models
        if reference is not None:
            refs.append(throughput(reference, window, ref_precision, args.steps, args.warmup, fused=True,
                                   d_model=shape.d_model, device=device))
            memory["reference"] = max(memory["reference"], peak_memory(device))
            if args.fp32_reference:
                refs32.append(throughput(reference, window, "fp32", args.steps, args.warmup, fused=True,
                                         d_model=shape.d_model, device=device))
        ours.append(throughput(model, window, args.precision, args.steps, args.warmup, fused=True,
                               d_model=shape.d_model, device=device))
        memory["ours"] = max(memory["ours"], peak_memory(device))
        if args.unfused_loss:
            unfused.append(throughput(model, window, args.precision, args.steps, args.warmup, fused=True,
                                      d_model=shape.d_model, device=device, fused_loss=False))
        static_text = ""
        if static is not None:
            eager_model, static_model, one = static
            one_eager.append(throughput(eager_model, one, args.precision, args.steps, args.warmup, fused=True,
                                        d_model=shape.d_model, device=device)[0])
            one_static.append(throughput(static_model, one, args.precision, args.steps, args.warmup, fused=True,
                                         d_model=shape.d_model, device=device)[0])
            static_text = f", one batch eager {one_eager[-1]:,.0f}, compiled static {one_static[-1]:,.0f}"
        if not on_gpu:
            peaks.append(measure_matmul_peak(device, peak_dtype, [(2048, 2048, 2048), (4096, 256, 1024)]))
        ref_text = (f"reference {refs[-1][0]:,.0f}, " if refs else "") + (
            f"reference in fp32 {refs32[-1][0]:,.0f}, " if refs32 else "")
        unfused_text = f", ours with the unfused loss {unfused[-1][0]:,.0f}" if unfused else ""
        print(f"round {r + 1}: {ref_text}ours {ours[-1][0]:,.0f}{unfused_text}{static_text} target tokens/s",
              flush=True)
    if on_gpu:
        peak, peak_text = gpu_peak(device)
        measured, how = measure_matmul_peak(device, torch.bfloat16, [(8192, 8192, 8192)])
        print(f"bf16 matrix-product peak measured in this run: {how}")
        print(f"peak GPU memory while training (torch.cuda.max_memory_allocated): ours "
              f"{memory['ours'] / 2**30:.2f} GiB" + (f", reference {memory['reference'] / 2**30:.2f} GiB"
                                                       if reference is not None else ""))
    else:
        peak, how = max(peaks)
        print(f"{args.precision} matrix-product peak, best of {args.rounds} rounds: {how}")
        peak_text = f"measured {args.precision} peak {_flops_text(peak, device)}"
    our, our_rate = float(np.median([t for t, _ in ours])), float(np.median([f for _, f in ours]))
    mode = " compiled" if args.compile else " eager"   # both models alike
    if refs:
        ref, ref_rate = float(np.median([t for t, _ in refs])), float(np.median([f for _, f in refs]))
        print(f"reference torch.nn.Transformer {ref_precision}{mode}, fused Adam: {ref:,.0f} target tokens/s "
              f"(median of {args.rounds}), {_flops_text(ref_rate, device)}, MFU {ref_rate / peak:.3f}")
    if refs32:
        ref32 = float(np.median([t for t, _ in refs32]))
        # The peak is measured in our precision: an fp32 rate is no fraction of it, so no MFU here.
        print(f"reference torch.nn.Transformer fp32{mode} (for comparison "
              f"only): {ref32:,.0f} target tokens/s (median of {args.rounds})")
    attention = "fused SDPA on CUDA" if on_gpu else "explicit attention on CPU"
    label = f"{args.precision}{mode}, fused Adam, {attention}"
    print(f"transformer package {label}: {our:,.0f} target tokens/s (median of {args.rounds}), "
          f"{_flops_text(our_rate, device)}, MFU {our_rate / peak:.3f}")
    print(f"preset {shape.preset} on {device.type}: {np.mean([w.flops for w in work]) / 1e9:,.1f} GFLOP per step "
          f"(matrix products, 3x forward), {np.mean([w.target_tokens for w in work]):,.0f} target tokens per batch")
    if unfused:
        plain = float(np.median([t for t, _ in unfused]))
        print(f"transformer package, the logits made whole and the loss after them: {plain:,.0f} target tokens/s "
              f"(median of {args.rounds}); fused_loss_ratio={our / plain:.2f}")
    if one_static:
        eager_one, static_one = float(np.median(one_eager)), float(np.median(one_static))
        print(f"transformer package on one repeated batch {tuple(static[2][0].batch.src.shape)} source, "
              f"{tuple(static[2][0].batch.tgt_in.shape)} target: eager {eager_one:,.0f}, compiled with static "
              f"shapes {static_one:,.0f} target tokens/s (median of {args.rounds}); "
              f"static_compile_ratio={static_one / eager_one:.3f}")
    if our_rate > peak:  # seen on an AVX2-only CPU, whose bf16 products run a slow shape-dependent fallback
        print(f"note: ours ran its products faster than the measured peak: this {args.precision} 'peak' is not "
              f"the device's, and MFU above 1 means nothing here")
    if on_gpu:
        print(f"mfu_measured_peak={our_rate / measured:.3f} (of the bf16 peak measured in this run, "
              f"{_flops_text(measured, device)})")
    print(f"mfu={our_rate / peak:.3f} (of {peak_text})")
    if refs32:
        print(f"fp32_reference_ratio={our / ref32:.2f} (ours in {args.precision} against the reference in fp32)")
    if refs:
        print(f"ratio={our / ref:.2f} (the same precision, {ref_precision})")


if __name__ == "__main__":
    main()
