"""Load on a served translator (``make serve-model``): latency and throughput over real HTTP.

Sends ``--requests`` requests of ``--batch`` sentences each (``{"dataframe_records": [{"text": ...}]}``)
from ``--concurrency`` threads to a running ``mlflow models serve`` and prints p50 / p95 latency,
sentences/s and the error count. Stops sending at ``--time-limit`` seconds (what was sent still
counts; unsent requests are reported).

The reference, measured in the same run: the same model in this process
(``mlflow.pyfunc.load_model`` of ``--model-uri``, by default the version ``make serve-model``
serves), translating the same requests one after another. ``ratio=`` is served sentences/s over
in-process sentences/s: what HTTP, JSON and the server cost, and what concurrency gains back.
``--model-uri none`` skips the reference (no ratio).

    make serve-model &                      # 127.0.0.1:5001
    .venv/bin/python bench/serve_load.py --requests 300 --concurrency 4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
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
                f"p95_ms={1000 * self.percentile(95):.1f} sentences_per_s={self.sentences_per_s:.1f} "
                f"wall_s={self.wall_s:.1f}")


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


def in_process_reference(model_uri: str, sentences: list[str], requests: int, batch: int) -> float:
    """Sentences/s of the same pyfunc model in this process, the same requests one after another."""
    import mlflow
    import pandas as pd

    model = mlflow.pyfunc.load_model(model_uri)
    model.predict(pd.DataFrame({"text": sentences[:1]}))   # warm-up, as the server's first request
    start = time.monotonic()
    for i in range(requests):
        model.predict(pd.DataFrame({"text": [sentences[(i * batch + j) % len(sentences)] for j in range(batch)]}))
    return requests * batch / (time.monotonic() - start)


def default_model_uri() -> str:
    """The version ``make serve-model`` serves (champion, else latest)."""
    from pipeline.params import PARAMS_FILE, load_params
    from pipeline.serving.mlflow_server import served_version
    from pipeline.tracking import store

    name = load_params(PARAMS_FILE).tracking.registered_model if Path(PARAMS_FILE).is_file() else "transformer"
    version, _ = served_version(store.client(), name)
    return f"models:/{name}/{version.version}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:5001/invocations")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1, help="sentences per request")
    parser.add_argument("--time-limit", type=float, default=120.0, help="stop sending after this many seconds")
    parser.add_argument("--sentences", type=Path, help="one source sentence a line (default: data/corpus/val.en "
                                                         "when present, else 10 built-in captions)")
    parser.add_argument("--model-uri", help="the reference's model (default: the served version); none: no reference")
    args = parser.parse_args()
    source = args.sentences or Path("data/corpus/val.en")
    sentences = SENTENCES
    if source.is_file():
        sentences = [s for s in source.read_text(encoding="utf-8").splitlines() if s.strip()]
    print(f"{args.url}: {args.requests} requests of {args.batch} sentence(s), {args.concurrency} concurrent, "
          f"{len(sentences)} distinct sentences", flush=True)
    status, _ = post(args.url, {"dataframe_records": [{"text": sentences[0]}]})   # warm-up, and is it there?
    if status != 200:
        sys.exit(f"error: {args.url} answered {status} to a valid request")
    result = run_load(args.url, sentences, args.requests, args.concurrency, args.batch, args.time_limit)
    print(f"served: {result.summary()}")
    for problem in result.errors[:5]:
        print(f"  error: {problem}")
    if args.model_uri == "none":
        return
    uri = args.model_uri or default_model_uri()
    reference = in_process_reference(uri, sentences, min(args.requests, 100), args.batch)
    print(f"reference (in-process pyfunc {uri}, sequential): sentences_per_s={reference:.1f}")
    print(f"ratio={result.sentences_per_s / reference:.2f}")


if __name__ == "__main__":
    main()
