"""The trainer's own step against another revision's, and its levers, in interleaved rounds.

``bench/train_throughput.py`` times the model's forward, loss, backward and Adam in a loop of its own;
this bench times what ``make run`` runs: ``transformer.training.trainer.Trainer.train`` (collation, the
update's bookkeeping, the log window), on the same token store, for every variant:

- ``ours``: this checkout's trainer as the train stage builds it;
- ``--against DIR``: the trainer of another checkout (``git worktree add DIR dc0e5c2``), the same
  model, settings and data; printed as ``against_ratio=<ours / theirs>``;
- ``--levers a,b`` (or ``all``): ours with one lever set: ``prefetch0`` (batches collated in the
  loop, the default on a CPU), ``prefetch2`` (collated two updates ahead on a thread, pinned on
  CUDA: the default there), ``processes2`` (two training processes of one thread each, gloo,
  ``max_tokens`` shared out as the train stage does: the same tokens per update; a lever that changes
  the batches, hence the outputs) against one process of all threads; the C allocator:
  ``malloc_system`` (the process as started: glibc's malloc), ``malloc_glibc`` (glibc kept from
  returning memory, ``GLIBC_TUNABLES``), ``jemalloc`` (Debian's ``libjemalloc2`` preloaded; the bench
  stops naming the package when it is missing); ``rdrop5``: R-Drop at alpha 5 (the batch twice in one
  forward, ``train.rdrop_alpha``), for what an R-Drop update costs against a plain one.

``--rdrop-alpha A`` trains every variant with R-Drop (``theirs`` too: a revision whose trainer has
``rdrop_alpha``), e.g. with ``--against`` for one R-Drop loss against another's.

``ours`` runs on the allocator the train stage chooses on this machine (``pipeline/stages/malloc.py``:
tcmalloc where installed, else glibc tuned; ``PIPELINE_MALLOC`` as for the stage), ``theirs`` as its
own stage ran, on the environment as it is (a revision from before the choice started nothing).

Each variant runs in a fresh process per round (``--threads`` torch threads in all), trains
``--warmup`` + ``--windows`` x ``--log-every`` updates and reports the target tokens per second of
each log window after the warm-up, as the trainer measures them; a round runs every variant once,
in a rotating order. The median over rounds and windows is printed per variant, then the ratios,
with the machine named. Speeds are never asserted (tests/bench runs it at a tiny size).

    python bench/train_step.py [--against DIR] [--levers all|a,b] [--rounds 3] [--windows 4] [--log-every 10]
                               [--token-store DIR] [--preset default|small|base|big] [--threads N]
                               [--precision auto] [--device auto|cpu|cuda] [--rdrop-alpha A]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVERS = ("prefetch0", "prefetch2", "processes2", "expandable", "compiled", "pad64", "malloc_system",
          "malloc_glibc", "jemalloc", "rdrop5")
JEMALLOC, JEMALLOC_PACKAGE = "libjemalloc.so.2", "libjemalloc2"


def jemalloc_library() -> str:
    """The path of the jemalloc the ``jemalloc`` lever preloads; stops naming the package if absent."""
    from pipeline.stages.malloc import LIBRARY_DIRS

    for directory in LIBRARY_DIRS:
        if (path := Path(directory) / JEMALLOC).is_file():
            return str(path)
    raise SystemExit(f"error: --levers jemalloc: {JEMALLOC} not found in {', '.join(LIBRARY_DIRS)} "
                     f"(Debian: apt-get install {JEMALLOC_PACKAGE})")


def allocator_env(name: str) -> dict[str, str]:
    """What a variant adds to the environment for its allocator (module docstring)."""
    from pipeline.stages import malloc

    if name in ("theirs", "malloc_system"):
        return {}
    if name == "malloc_glibc":
        return malloc.plan({malloc.MALLOC_ENV: "glibc"}).env
    if name == "jemalloc":
        return {"LD_PRELOAD": jemalloc_library()}
    return malloc.plan(os.environ).env   # the train stage's choice


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                kind = "amx_bf16" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "avx2"
                return f"{line.split(':', 1)[1].strip()} ({kind}, {os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def synthetic_store(path: Path, vocab: int, n_pairs: int = 6000, seed: int = 0, mean_len: float = 14.0) -> Path:
    """Pairs with a translation length profile: source ``mean_len`` +- 0.36 of it pieces (Multi30k: 14
    +- 5; WMT14: about 27), target 1.1 +- 0.15 times the source."""
    import numpy as np

    from transformer.training.token_store import write_token_store

    rng = np.random.default_rng(seed)
    scale = mean_len / 14.0
    src_len = np.clip(rng.normal(mean_len, 5 * scale, n_pairs).astype(int), 3, int(60 * scale))
    tgt_len = np.clip((src_len * rng.normal(1.1, 0.15, n_pairs)).astype(int), 3, int(70 * scale))
    pairs = [(rng.integers(4, vocab, s).tolist(), rng.integers(4, vocab, t).tolist()) for s, t in zip(src_len, tgt_len)]
    write_token_store(path, pairs, vocab_size=vocab)
    return path


# ------------------------------------------------------------------ the worker (one variant, one round)
def worker(args: argparse.Namespace) -> None:
    """Train in this process (or, with --processes 2, in two spawned ones) with the trainer found at --root."""
    sys.path.insert(0, str(Path(args.root).resolve()))
    if args.processes > 1:
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as rendezvous:
            mp.spawn(_train, args=(args, f"file://{rendezvous}/store"), nprocs=args.processes)
        return
    _train(0, args, "")


def _train(rank: int, args: argparse.Namespace, init_method: str) -> None:
    import torch

    torch.set_num_threads(max(1, args.threads // args.processes))
    if init_method:
        import torch.distributed as dist
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=args.processes)
    from transformer.config import ModelConfig
    from transformer.model import Transformer
    try:
        from transformer.training.token_store import TokenStore
        from transformer.training.trainer import TrainConfig, Trainer, TrainerCallback
    except ModuleNotFoundError:   # a checkout from before transformer/training/ (dc0e5c2's, for --against)
        from transformer.data import TokenStore  # type: ignore[no-redef]
        from transformer.trainer import TrainConfig, Trainer, TrainerCallback  # type: ignore[no-redef]

    rates: list[float] = []

    class Speed(TrainerCallback):
        def on_log(self, step: int, metrics: dict[str, float]) -> None:
            rates.append(metrics["train/target_tokens_per_s"])

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_dict(json.loads(args.model_config)))
    config = TrainConfig(max_tokens=args.max_tokens // args.processes, warmup_steps=300, lr_scale=0.6,
                         max_steps=args.log_every * (args.windows + 1), log_every=args.log_every,
                         checkpoint_every_steps=0, precision=args.precision, device=args.device, seed=1,
                         compile=args.compile, pad_multiple=args.pad_multiple,
                         **({"rdrop_alpha": args.rdrop_alpha} if args.rdrop_alpha > 0 else {}))
    # -1: the trainer's default (a revision without the argument has none: it collates in the loop)
    extra = {"prefetch": args.prefetch} if args.prefetch >= 0 else {}
    trainer = Trainer(model, config, TokenStore(args.token_store), callbacks=[Speed()], **extra)
    trainer.train()
    if rank == 0:   # the first window is the warm-up (allocator, oneDNN's kernel choices)
        print("RATES " + json.dumps(rates[1:]), flush=True)
    if init_method:
        import torch.distributed as dist
        dist.destroy_process_group()


# ------------------------------------------------------------------ the driver
def run_variant(name: str, root: Path, args: argparse.Namespace, model_config: str, store: Path) -> list[float]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--root", str(root),
               "--model-config", model_config, "--token-store", str(store), "--max-tokens", str(args.max_tokens),
               "--log-every", str(args.log_every), "--windows", str(args.windows), "--threads", str(args.threads),
               "--precision", args.precision, "--device", args.device,
               "--processes", "2" if name == "processes2" else "1"]
    if name.startswith("prefetch"):
        command += ["--prefetch", name[len("prefetch"):]]
    command += ["--compile"] if name == "compiled" else ["--pad-multiple", "64"] if name == "pad64" else []
    command += ["--rdrop-alpha", "5" if name == "rdrop5" else str(args.rdrop_alpha)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1" if name == "processes2" else str(args.threads)}
    if name == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env.update(allocator_env(name))
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=root)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RATES ")]
    if result.returncode or not lines:
        raise SystemExit(f"error: variant {name} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1][len("RATES "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    parser.add_argument("--model-config", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pad-multiple", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--against", type=Path, help="another checkout whose trainer to time (a git worktree)")
    parser.add_argument("--levers", default="",
                        help=f"also ours with each lever set: all, or some of {','.join(LEVERS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--windows", type=int, default=4, help="log windows timed per round, after one of warm-up")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--token-store", type=Path, help="a token store (data/tokens/train); default: synthetic")
    parser.add_argument("--preset", choices=("default", "small", "base", "big"), default="default")
    parser.add_argument("--max-tokens", type=int, default=0, help="padded tokens per update (default: the preset's)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--rdrop-alpha", type=float, default=0.0, help="R-Drop's alpha for every variant (0: off)")
    args = parser.parse_args()
    levers = list(LEVERS) if args.levers == "all" else [lever for lever in args.levers.split(",") if lever]
    if unknown := set(levers) - set(LEVERS):
        parser.error(f"--levers: unknown {', '.join(sorted(unknown))}; choose all or some of {','.join(LEVERS)}")
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from train_throughput import SHAPES, params_shape

    from pipeline.config.errors import ParamsError
    from pipeline.stages import malloc

    try:
        ours_malloc = malloc.plan(os.environ)   # a bad PIPELINE_MALLOC or a missing library: before any round
    except ParamsError as err:
        raise SystemExit(f"error: {err}") from None
    if "jemalloc" in levers:
        jemalloc_library()

    from transformer.config import build_config

    shape = params_shape() if args.preset == "default" else SHAPES[args.preset]
    args.max_tokens = args.max_tokens or shape.max_tokens
    with tempfile.TemporaryDirectory() as tmp:
        store = args.token_store or synthetic_store(Path(tmp) / "store", shape.vocab, mean_len=shape.mean_len)
        from transformer.training.token_store import TokenStore
        vocab = TokenStore(store).vocab_size
        if args.preset == "default":   # params.yaml's model as make run builds it, on the store's vocabulary
            from pipeline.config.params import load_params
            params = load_params(ROOT / "params.yaml")
            config = params.model.config(vocab)
        else:
            config = build_config(args.preset, vocab)   # the package's own preset (Table 3's base and big)
        model_config = json.dumps(config.to_dict())
        variants: dict[str, Path] = {"ours": ROOT}
        if args.against:
            variants["theirs"] = args.against.resolve()
        variants.update({lever: ROOT for lever in levers})
        rates: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for round_ in range(args.rounds):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                rates[name] += run_variant(name, variants[name], args, model_config, store)
            print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                f"{n} {statistics.median(rates[n]):,.0f}" for n in names), flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    import torch
    gpu = args.device != "cpu" and torch.cuda.is_available()
    machine = f"{torch.cuda.get_device_name()}, host {cpu_name()}" if gpu else cpu_name()
    print(f"machine: {machine}, {args.threads} threads, precision {args.precision}, preset {shape.preset} "
          f"(d_model {shape.d_model}, {shape.layers}+{shape.layers} layers), {args.max_tokens} tokens per update")
    print(f"ours on the train stage's allocator: {ours_malloc.describe()}"
          + (f"; every variant with R-Drop, alpha {args.rdrop_alpha:g}" if args.rdrop_alpha > 0 else ""))
    for name, value in median.items():
        where = f" ({variants[name]})" if name == "theirs" else ""
        print(f"{name:>11}{where}: {value:,.0f} target tokens/s (median of {len(rates[name])} windows)")
    for lever in LEVERS:
        if lever in median:
            print(f"{lever}_ratio={median[lever] / median['ours']:.3f}")
    if "theirs" in median:
        print(f"against_ratio={median['ours'] / median['theirs']:.3f}")


if __name__ == "__main__":
    main()
