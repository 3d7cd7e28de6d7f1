"""WMT14 at scale: the real download, tokenizer and train stages on WMT14-shaped corpora.

For each size, a synthetic WMT14 EN-DE mirror (``tests/wmt14_fixture.py``: the five statmt archives
under their real names, WMT-like sentence lengths and vocabulary) is served over HTTP from
127.0.0.1 (Range-capable) as ``DATA_MIRROR``, and the stages run as DVC runs them
(``python -m pipeline.stages.<stage>`` in a workspace holding ``params/wmt14_en_de_base.yaml``):

- download: fetch, verify, extract, read and clean into ``data/corpus``;
- tokenizer: SentencePiece training on the recipe's ``input_sentence_size`` sample, then every
  split encoded into the token store;
- train: the ``base`` preset on CPU until its 5th update (time to the first update is the
  start-up: opening the memory-mapped store, batching, building the model);
- train-ddp (largest size, ``--ddp``): the same under ``torchrun --nproc_per_node=2`` (gloo).

Each row: wall time, peak resident memory of the stage's process tree (and, for training, the part
not backed by files: the memory-mapped store is file-backed and can be dropped by the kernel),
bytes written to disk. The last line is ``ratio=<x>``: seconds per million pairs of the data stages
(download + tokenizer) at the largest size divided by that at the smallest (1.0 = linear cost).

    python bench/data_scale.py [--pairs 500000 1500000 4500000] [--work /tmp/data_scale] [--ddp]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes import range_server  # noqa: E402  (the Range-capable server of the download tests)

FIRST_UPDATE = re.compile(r"^step\s+1\s")


@dataclass
class Row:
    stage: str
    pairs: int
    seconds: float
    peak_rss: int
    peak_anon: int
    written: int
    note: str = ""


class TreeMonitor:
    """Polls a process and its descendants: peak summed RSS, peak summed anonymous RSS (RSS less
    file-backed pages) and bytes written (the last counter seen of each process)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = self.peak_anon = 0
        self.written: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            rss = anon = 0
            for proc in procs:
                try:
                    mem = proc.memory_info()
                    rss += mem.rss
                    anon += mem.rss - mem.shared
                    self.written[proc.pid] = proc.io_counters().write_bytes
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_stage(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, TreeMonitor, float | None]:
    """Run ``cmd``; returns (wall seconds, its monitor, seconds to the first training update or None)."""
    start = time.monotonic()
    first_update = None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        monitor = TreeMonitor(proc.pid)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if first_update is None and FIRST_UPDATE.match(line):
                first_update = time.monotonic() - start
        proc.wait()
    seconds = time.monotonic() - start
    monitor.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log}:\n" + log.read_text()[-3000:])
    return seconds, monitor, first_update


def make_mirror(pairs: int, root: Path, seed: int, eval_sentences: int) -> float:
    """The synthetic mirror for ``pairs`` (reused when already complete); generation seconds."""
    stamp = root / ".complete"
    if stamp.is_file():
        return 0.0
    shutil.rmtree(root, ignore_errors=True)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "tests.wmt14_fixture", "--pairs", str(pairs), "--out", str(root),
                    "--seed", str(seed), "--dev", str(eval_sentences), "--test", str(eval_sentences)],
                   cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    stamp.write_text("ok\n")
    return time.monotonic() - start


def workspace(root: Path, args: argparse.Namespace) -> Path:
    """A folder holding the base recipe's params.yaml with the bench's overrides."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    params = yaml.safe_load((REPO / "params" / "wmt14_en_de_base.yaml").read_text())
    params["data"]["incoming_dir"] = ""
    if args.vocab_size:
        params["tokenizer"]["vocab_size"] = args.vocab_size
    # bf16 only where the CPU has bf16 kernels: elsewhere it is emulated, about 15x slower than fp32
    from transformer.precision import cpu_supports_bf16
    params["train"].update(max_steps=5, device="cpu", log_every=1, validate_every=0, checkpoint_every_steps=5,
                           max_tokens=args.train_max_tokens, max_epochs=0,
                           precision="bf16" if cpu_supports_bf16() else "fp32")
    params["tracking"]["experiment"] = "bench-data-scale"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, nargs="+", default=[500_000, 1_500_000, 4_500_000])
    parser.add_argument("--work", type=Path, default=Path("/tmp/data_scale"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=0, help="override the recipe's 37000 (0 = keep)")
    parser.add_argument("--train-max-tokens", type=int, default=4096,
                        help="padded tokens per training batch on CPU (the recipe's 25000 is a GPU batch)")
    parser.add_argument("--eval-sentences", type=int, default=500,
                        help="newstest2013/2014 sizes (the training stage validates on newstest2013 at its end)")
    parser.add_argument("--no-train", action="store_true", help="data stages only")
    parser.add_argument("--ddp", action="store_true", help="also torchrun --nproc_per_node=2 on the largest store")
    args = parser.parse_args()

    rows: list[Row] = []
    python = sys.executable
    for pairs in sorted(args.pairs):
        mirror = args.work / f"mirror-{pairs}"
        generated = make_mirror(pairs, mirror, args.seed, args.eval_sentences)
        print(f"{pairs:,} pairs: mirror {mirror} ({'reused' if not generated else f'generated in {generated:.0f} s'}), "
              f"{disk_bytes(mirror) / 2**20:,.0f} MiB", flush=True)
        ws = workspace(args.work / f"ws-{pairs}", args)
        with range_server(mirror, cut_once=set()) as (url, _):
            env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "DATA_MIRROR": url,
                   "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
                   "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
                   "DATA_CHECKSUMS": str(ws / "checksums.json")}   # the synthetic hashes stay out of the repo
            stages = [("download", [python, "-m", "pipeline.stages.download"]),
                      ("tokenizer", [python, "-m", "pipeline.stages.tokenizer"])]
            if not args.no_train:
                stages.append(("train", [python, "-m", "pipeline.stages.train"]))
            for name, cmd in stages:
                seconds, mon, first = run_stage(cmd, ws, env, ws / f"{name}.log")
                note = f"first update after {first:.1f} s" if first is not None else ""
                rows.append(Row(name, pairs, seconds, mon.peak_rss, mon.peak_anon, sum(mon.written.values()), note))
                print(f"  {name}: {seconds:.1f} s, peak {mon.peak_rss / 2**30:.2f} GiB {note}", flush=True)
            if args.ddp and pairs == max(args.pairs) and not args.no_train:
                shutil.rmtree(ws / "models", ignore_errors=True)
                torchrun = str(Path(python).parent / "torchrun")
                cmd = [torchrun, "--standalone", "--nproc_per_node=2", "-m", "pipeline.stages.train"]
                seconds, mon, first = run_stage(cmd, ws, {**env, "OMP_NUM_THREADS": "1"}, ws / "train-ddp.log")
                note = f"2 processes (gloo); first update after {first:.1f} s" if first is not None else "2 processes"
                rows.append(Row("train-ddp", pairs, seconds, mon.peak_rss, mon.peak_anon, sum(mon.written.values()),
                                note))

    print()
    print("| stage | pairs | wall time | peak RSS (tree) | of it not file-backed | disk written | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r.stage} | {r.pairs:,} | {r.seconds:.1f} s | {r.peak_rss / 2**30:.2f} GiB | "
              f"{r.peak_anon / 2**30:.2f} GiB | {r.written / 2**20:,.0f} MiB | {r.note} |")
    data_seconds = {p: sum(r.seconds for r in rows if r.pairs == p and r.stage in ("download", "tokenizer"))
                    for p in args.pairs}
    small, large = min(args.pairs), max(args.pairs)
    per_million = {p: data_seconds[p] / (p / 1e6) for p in (small, large)}
    print(f"data stages: {per_million[small]:.1f} s per million pairs at {small:,}, "
          f"{per_million[large]:.1f} s at {large:,}")
    print(f"ratio={per_million[large] / per_million[small]:.2f}")


if __name__ == "__main__":
    main()
