"""Load on the served translator over real HTTP: our server (``make serve-model``) against
MLflow's scoring server (``mlflow models serve``) of the same registered version, in one run.

Starts both servers itself on free 127.0.0.1 ports (the version ``make serve-model`` would serve:
champion, else latest, from ``MLFLOW_TRACKING_URI`` or ``mlflow.db``), then, for each level of
``--levels`` (default 1, 4 and 16 closed-loop clients, each sending its next request when the last
is answered), ``--requests-per-client`` one-sentence requests from the test set. Prints p50, p95,
p99 latency, sentences/s and errors per level and server, then the references of the same run:
the same version in this process, one sentence at a time (p50), and offline in batches of 16
(sentences/s). ``ratio=`` last: our sentences/s at the highest level over MLflow's.

    .venv/bin/python bench/serve_load.py                       # the CPU is named in the first line
    .venv/bin/python bench/serve_load.py --levels 1,4 --requests-per-client 20 --no-mlflow
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

SENTENCES = [
    "A man is riding a bike.", "Two dogs play in the snow.", "A little girl climbs into a wooden playhouse.",
    "A group of people stand in front of an igloo.", "A woman in a red coat walks down the street.",
    "Several men in hard hats are operating a giant pulley system.", "A boy jumps into the water.",
    "Two young children are sitting on a bench.", "A man sleeps on a park bench.",
    "People are walking on a busy city street at night.",
]


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sentences: int = 0
    unsent: int = 0
    wall_s: float = 0.0

    def percentile(self, q: float) -> float:
        """The q-th percentile latency in seconds (nearest rank)."""
        ordered = sorted(self.latencies_s)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else 0.0

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.wall_s if self.wall_s else 0.0

    def summary(self) -> str:
        return (f"requests={len(self.latencies_s) + len(self.errors)} errors={len(self.errors)} unsent={self.unsent} "
                f"p50_ms={1000 * statistics.median(self.latencies_s or [0]):.1f} "
                f"p95_ms={1000 * self.percentile(95):.1f} p99_ms={1000 * self.percentile(99):.1f} "
                f"sentences_per_s={self.sentences_per_s:.1f} wall_s={self.wall_s:.1f}")


def post(url: str, payload: dict, timeout: float = 60.0) -> tuple[int, dict]:
    """POST ``payload`` as JSON; (status, parsed body) for 2xx and 4xx/5xx answers alike."""
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body or b"{}")
        except ValueError:
            return err.code, {"message": body.decode(errors="replace")}


def run_load(url: str, sentences: list[str], requests: int, concurrency: int, batch: int = 1,
             time_limit_s: float = 120.0, timeout_s: float = 60.0) -> LoadResult:
    """``requests`` requests of ``batch`` sentences (cycling through ``sentences``) from
    ``concurrency`` threads; each answer must be 200 with one translation per sentence."""
    result, lock = LoadResult(), threading.Lock()
    start = time.monotonic()
    deadline = start + time_limit_s

    def one(i: int) -> None:
        if time.monotonic() > deadline:
            with lock:
                result.unsent += 1
            return
        texts = [sentences[(i * batch + j) % len(sentences)] for j in range(batch)]
        sent = time.monotonic()
        try:
            status, body = post(url, {"dataframe_records": [{"text": t} for t in texts]}, timeout_s)
            ok = status == 200 and len(body.get("predictions", [])) == len(texts)
            problem = "" if ok else f"HTTP {status}: {str(body)[:200]}"
        except (OSError, ValueError) as err:   # connection refused/reset, timeout, bad JSON
            problem = f"{type(err).__name__}: {err}"
        elapsed = time.monotonic() - sent
        with lock:
            if problem:
                result.errors.append(problem)
            else:
                result.latencies_s.append(elapsed)
                result.sentences += len(texts)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    result.wall_s = time.monotonic() - start
    return result


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            flags = Path("/proc/cpuinfo").read_text()
            extra = " with AVX512-BF16" if "avx512_bf16" in flags else (" with AMX" if "amx_bf16" in flags else "")
            return f"{line.split(':', 1)[1].strip()}{extra}"
    return "unknown CPU"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module: str, name: str, version: str, threads: int) -> tuple[subprocess.Popen, str]:
    """``python -m <module>`` serving ``name`` (the server picks champion/latest; MLflow's gets --version)."""
    port = free_port()
    extra = ["--threads", str(threads)] if module.endswith(".server") else ["--version", version]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    process = subprocess.Popen([sys.executable, "-m", module, "--name", name, "--port", str(port), *extra],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            sys.exit(f"error: {module} did not start (exit {process.returncode})")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2):
                return process, f"{url}/invocations"
        except OSError:
            time.sleep(0.5)


def stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def references(name: str, version: str, why: str, run_id: str, sentences: list[str],
               threads: int) -> tuple[float, float]:
    """(p50 seconds of one sentence in-process, offline sentences/s in batches of 16) of the same version."""
    import torch

    from pipeline.serving.server.model_source import load_version
    from pipeline.tracking import store

    torch.set_num_threads(threads)
    translator = load_version(store.tracking_uri(), name, version, why, run_id).translator
    single = []
    with torch.inference_mode():
        for sentence in sentences[:60]:
            started = time.monotonic()
            translator.translate([sentence])
            single.append(time.monotonic() - started)
        started = time.monotonic()
        for i in range(0, len(sentences), 16):
            translator.translate(sentences[i:i + 16])
        offline = len(sentences) / (time.monotonic() - started)
    return statistics.median(single), offline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="registered model (default: tracking.registered_model of params.yaml)")
    parser.add_argument("--levels", default="1,4,16", help="closed-loop clients per level, comma-separated")
    parser.add_argument("--requests-per-client", type=int, default=30)
    parser.add_argument("--sentences", type=Path, default=Path("data/corpus/test_2016_flickr.en"),
                        help="one source sentence a line (default: the test set; else 10 built-in captions)")
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1),
                        help="torch threads of both servers and the references (default: the server's)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="per level and server")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow's server (no ratio)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the servers it started stop too (finally)
    from pipeline.config.loader import PARAMS
    from pipeline.config.params import load_params
    from pipeline.serving.server.model_source import wanted_version
    from pipeline.tracking import store

    name = args.name or (load_params(PARAMS).tracking.registered_model if PARAMS.is_file()
                         else "transformer")
    version, why, run_id = wanted_version(store.client(), name)
    sentences = SENTENCES
    if args.sentences.is_file():
        sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    levels = [int(x) for x in args.levels.split(",")]
    print(f"{cpu_name()}, {args.threads} threads; {name} version {version} ({why}); one-sentence requests from "
          f"{len(sentences)} sentences, {args.requests_per_client} per client", flush=True)
    servers = [("ours", "pipeline.serving.server")] + ([] if args.no_mlflow else
                                                        [("mlflow", "pipeline.serving.mlflow_server")])
    throughput: dict[tuple[str, int], float] = {}
    for label, module in servers:
        process, url = start(module, name, version, args.threads)
        try:
            post(url, {"inputs": [sentences[0]]})   # warm-up
            for clients in levels:
                result = run_load(url, sentences, clients * args.requests_per_client, clients,
                                  time_limit_s=args.time_limit)
                throughput[(label, clients)] = result.sentences_per_s
                print(f"{label:6s} clients={clients:<3d} {result.summary()}", flush=True)
                for problem in result.errors[:3]:
                    print(f"  error: {problem}")
        finally:
            stop(process)
    single_p50, offline = references(name, version, why, run_id, sentences[:400], args.threads)
    print(f"reference in-process, one sentence: p50_ms={1000 * single_p50:.1f}")
    print(f"reference offline, batches of 16: sentences_per_s={offline:.1f}")
    if not args.no_mlflow:
        top = max(levels)
        print(f"ratio={throughput[('ours', top)] / throughput[('mlflow', top)]:.2f}")


if __name__ == "__main__":
    main()
