"""Load on the served translator over real HTTP: our server (``make serve-model``) with each decoding
engine against MLflow's scoring server (``mlflow models serve``) of the same registered version, in
one run.

Starts each server itself on a free 127.0.0.1 port (the version ``make serve-model`` would serve:
champion, else latest, from ``MLFLOW_TRACKING_URI`` or ``mlflow.db``): ours with the version's
engine, ours with the other one forced (``--engine``; CTranslate2 only where the version carries
its export), then MLflow's, which decodes with the version's engine through the pyfunc model. For
each level of ``--levels`` (default 1, 4 and 16 closed-loop clients, each sending its next request
when the last is answered), ``--requests-per-client`` (100) one-sentence requests from the test set.
Prints p50, p95, p99 latency, sentences/s and errors per level and server. The references, in
this process with the server's threads, measured close to the levels they are compared with (a shared
machine's load moves from second to second). The one-client and the top level on CTranslate2 run
``--rounds`` (5) times each, each round between two halves of its reference (the rounds pooled, each
round's ratio printed): raw CTranslate2 (``translate_batch`` of the same engine on a sentence's
pieces, with the options our wrapper passes) one sentence at a time on the sentences the one-client
level sends; offline in batches of 16 on 2 x 200 test sentences at the top (sentences/s; CTranslate2
given them all, its batches spread over its ``inter_threads``). After each of our servers, the same
engine's translator one sentence at a time, and our search offline too. Then a live swap under
load (``--swap-clients`` clients, our server on the version's engine, its registry a temporary copy
holding the version twice: the champion moved from one to the other, every answer must be a 200).

Then the serving issue's goals as ratios of this run, for our server on CTranslate2: one client's
p50 over raw CTranslate2's one-sentence p50 (at most 1.25), the top level's sentences/s over the
engine's offline rate (at least 0.9) and over our server on torch (at least 2), 4 clients' p95 over
one client's p50 (at most 3); and ``ratio=`` last: our server on the version's engine at the top
level over MLflow's (sentences/s; at least 5).

    .venv/bin/python bench/serve_load.py                       # the CPU is named in the first line
    .venv/bin/python bench/serve_load.py --levels 1,4 --requests-per-client 20 --no-mlflow --no-swap
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OFFLINE = 200   # sentences of each half of an offline reference (batches of 16), before and after a round
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

    def merge(self, other: LoadResult) -> None:
        """Add ``other``'s requests (a level run again: its rounds)."""
        self.latencies_s += other.latencies_s
        self.errors += other.errors
        self.sentences += other.sentences
        self.unsent += other.unsent
        self.wall_s += other.wall_s

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


class Connection:
    """One client's keep-alive HTTP connection, as a real client keeps one (a new TCP connection a
    request would add its handshake to every latency), reopened after an error (a level's clients
    send without pause, within the servers' keep-alive). ``post`` answers as the function does."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.path, self.timeout = parts.hostname, parts.port, parts.path, timeout
        self.connection: http.client.HTTPConnection | None = None
        self.headers: Any = {}   # the last answer's

    def post(self, payload: dict) -> tuple[int, dict]:
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.connection.request("POST", self.path, json.dumps(payload).encode(),
                                    {"Content-Type": "application/json"})
            response = self.connection.getresponse()
            data, self.headers = response.read(), response.headers
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        try:
            return response.status, json.loads(data or b"{}")
        except ValueError:
            return response.status, {"message": data.decode(errors="replace")}

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def run_load(url: str, sentences: list[str], requests: int, concurrency: int, batch: int = 1,
             time_limit_s: float = 120.0, timeout_s: float = 60.0, until: threading.Event | None = None,
             answered: list[tuple[float, str]] | None = None) -> LoadResult:
    """``requests`` requests of ``batch`` sentences (cycling through ``sentences``) from
    ``concurrency`` closed-loop clients (or until ``until`` is set); each answer must be 200 with
    one translation per sentence. ``answered`` gets (time, X-Model-Version) of each answer."""
    result, lock, counter = LoadResult(), threading.Lock(), itertools.count()
    start = time.monotonic()
    deadline = start + time_limit_s

    def client() -> None:
        connection = Connection(url, timeout_s)
        while (i := next(counter)) < requests and not (until and until.is_set()):
            if time.monotonic() > deadline:
                with lock:
                    result.unsent += 1
                continue
            texts = [sentences[(i * batch + j) % len(sentences)] for j in range(batch)]
            sent = time.monotonic()
            try:
                status, body = connection.post({"dataframe_records": [{"text": t} for t in texts]})
                ok = status == 200 and len(body.get("predictions", [])) == len(texts)
                problem = "" if ok else f"HTTP {status}: {str(body)[:200]}"
            except (OSError, ValueError, http.client.HTTPException) as err:   # refused, reset, timeout, bad JSON
                problem = f"{type(err).__name__}: {err}"
            elapsed = time.monotonic() - sent
            with lock:
                if problem:
                    result.errors.append(problem)
                    continue
                result.latencies_s.append(elapsed)
                result.sentences += len(texts)
                if answered is not None:
                    answered.append((time.monotonic(), connection.headers.get("X-Model-Version")))
        connection.close()

    clients = [threading.Thread(target=client) for _ in range(concurrency)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    result.wall_s = time.monotonic() - start
    return result


def cpu_name() -> str:
    """The CPU's model name and whether it has bf16 units (AVX512-BF16, AMX): the figures depend on both."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                "unknown CPU")
    units = [label for flag, label in (("avx512_bf16", "AVX512-BF16"), ("amx_bf16", "AMX")) if flag in text]
    return f"{name}{' with ' + ' and '.join(units) if units else ''}"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_CPUS: set[int] | None = None   # --server-cpus: the servers' cores (the bench keeps the others)


def start(module: str, name: str, options: list[str], threads: int, **env: str) -> tuple[subprocess.Popen, str]:
    """``python -m <module> --name <name> <options>`` on a free port; (the process, its /invocations)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", **env}
    cpus = SERVER_CPUS
    process = subprocess.Popen([sys.executable, "-m", module, "--name", name, "--port", str(port), *options],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
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


@dataclass
class Version:
    """The served version: its name, number, why it is served, run, download URI, settings, export."""

    name: str
    version: str
    why: str
    run_id: str
    source: str
    decoding: Any          # its registered DecodingConfig
    exported: bool         # carries artifacts/ctranslate2


def served_version(name: str) -> Version:
    import mlflow

    from pipeline.serving.registered import mlmodel_settings
    from pipeline.serving.server.model_source import CT2_ARTIFACT, wanted_version
    from pipeline.tracking import store

    version, why, run_id = wanted_version(store.client(), name)
    uri = store.tracking_uri()
    source = store.client().get_model_version_download_uri(name, version).rstrip("/")
    with tempfile.TemporaryDirectory() as tmp:
        mlmodel = mlflow.artifacts.download_artifacts(artifact_uri=f"{source}/MLmodel", dst_path=tmp,
                                                      tracking_uri=uri)
        decoding = mlmodel_settings(mlmodel)
    listed = mlflow.artifacts.list_artifacts(artifact_uri=f"{source}/artifacts", tracking_uri=uri)
    exported = any(Path(a.path).name == CT2_ARTIFACT and a.is_dir for a in listed)
    return Version(name, version, why, run_id, source, decoding, exported)


def rate(timed: list[tuple[int, float]]) -> float:
    """Sentences/s of (sentences, seconds) runs pooled."""
    return sum(n for n, _ in timed) / sum(seconds for _, seconds in timed)


def p50(decode: Callable[[Any], Any], items: list[Any]) -> float:
    """Median seconds of ``decode`` over ``items`` (after three to warm up)."""
    for item in items[:3]:
        decode(item)
    times = []
    for item in items:
        started = time.perf_counter()
        decode(item)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class Reference:
    """The same version in this process, on ``engine``, with the server's threads: one sentence at
    a time through our translator, raw CTranslate2 on one sentence's pieces, offline in batches."""

    def __init__(self, v: Version, engine: str, threads: int, ct2_threads: tuple[int, int]) -> None:
        import torch

        from pipeline.serving.server.model_source import load_version
        from pipeline.tracking import store

        torch.set_num_threads(threads)
        self.translator = load_version(store.tracking_uri(), v.name, v.version, v.why, v.run_id,
                                       threads=ct2_threads, engine=engine).translator

    @property
    def ct2(self) -> bool:
        from pipeline.serving.ct2_translator import CT2Translator

        return isinstance(self.translator, CT2Translator)

    def one(self, sentences: list[str]) -> float:
        """p50 seconds of one sentence through our translator (tokenizing included)."""
        return p50(lambda s: self.translator.translate([s]), sentences)

    def raw(self, ids: list[int]) -> Any:
        """``translate_batch`` of the engine on one sentence's pieces, with the options our wrapper passes."""
        t = self.translator
        return t.engine.translate_batch([[t.vocabulary[i] for i in ids]], beam_size=t.decoding.beam_size,
                                        length_penalty=t.decoding.alpha, max_decoding_length=t.limits([ids])[0],
                                        min_decoding_length=0, max_input_length=0, suppress_sequences=t.suppressed)

    def raw_times(self, sentences: list[str]) -> list[float]:
        """Seconds of raw ``translate_batch`` on each sentence's pieces, one at a time (after three)."""
        ids = self.translator.tokenizer.encode(sentences)
        for pieces in ids[:3]:
            self.raw(pieces)
        times = []
        for pieces in ids:
            began = time.perf_counter()
            self.raw(pieces)
            times.append(time.perf_counter() - began)
        return times

    def offline(self, sentences: list[str]) -> float:
        """Sentences/s in batches of 16: CTranslate2 given them all at once (its batches spread over
        its replicas), our search 16 at a time."""
        return len(sentences) / self.offline_seconds(sentences)

    def offline_seconds(self, sentences: list[str]) -> float:
        """Seconds to translate ``sentences`` offline (``offline``'s batches)."""
        import torch

        t = self.translator
        started = time.perf_counter()
        with torch.inference_mode():
            if self.ct2:
                kept, t.decoding = t.decoding, t.decoding.replace(batch_sentences=16)
                try:
                    t.translate(sentences)
                finally:
                    t.decoding = kept
            else:
                for i in range(0, len(sentences), 16):
                    t.translate(sentences[i:i + 16])
        return time.perf_counter() - started


def swap_under_load(v: Version, options: list[str], threads: int, clients: int,
                    sentences: list[str]) -> tuple[LoadResult, str]:
    """Our server on a temporary registry holding ``v``'s files as versions 1 and 2, under
    ``clients`` closed-loop clients; the champion moved from 1 to 2. Returns the load and what
    answered: each version's answers, and when version 2 first and version 1 last answered (seconds
    from the move: requests accepted on 1 finish on 1)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipeline.tracking import store

    with tempfile.TemporaryDirectory(prefix="serve-load-swap-") as tmp:
        copy = Path(tmp) / "version"
        for path in ("MLmodel", "artifacts"):
            mlflow.artifacts.download_artifacts(artifact_uri=f"{v.source}/{path}", dst_path=str(copy),
                                                tracking_uri=store.tracking_uri())
        uri = f"sqlite:///{tmp}/swap.db"
        client = MlflowClient(uri, uri)
        experiment = client.create_experiment("serve-load-swap", artifact_location=(Path(tmp) / "runs").as_uri())
        client.create_registered_model(v.name)
        for _ in range(2):
            run = client.create_run(experiment)
            client.log_artifacts(run.info.run_id, str(copy), "translator")
            client.create_model_version(v.name, f"{run.info.artifact_uri}/translator", run.info.run_id)
        client.set_registered_model_alias(v.name, store.CHAMPION_ALIAS, "1")
        process, url = start("pipeline.serving.server", v.name, [*options, "--poll-seconds", "0.5"], threads,
                             MLFLOW_TRACKING_URI=uri)
        answered: list[tuple[float, str]] = []
        halt = threading.Event()
        box: list[LoadResult] = []
        load = threading.Thread(target=lambda: box.append(run_load(url, sentences, sys.maxsize, clients,
                                                                   time_limit_s=600, until=halt, answered=answered)))
        try:
            load.start()
            time.sleep(3.0)
            moved = time.monotonic()
            client.set_registered_model_alias(v.name, store.CHAMPION_ALIAS, "2")
            while not any(version == "2" for _, version in answered) and time.monotonic() < moved + 120:
                time.sleep(0.1)
            time.sleep(3.0)   # and the old version drained
        finally:
            halt.set()
            load.join()
            stop(process)
        result = box[0]
    counts = collections.Counter(version for _, version in answered)
    first = min((at for at, version in answered if version == "2"), default=math.nan) - moved
    last = max((at for at, version in answered if version == "1"), default=math.nan) - moved
    return result, (f"versions=1:{counts['1']},2:{counts['2']} first_of_2_s={first:.2f} last_of_1_s={last:.2f}"
                    f"{' OTHER:' + str(dict(counts)) if set(counts) - {'1', '2'} else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", help="registered model (default: tracking.registered_model of params.yaml)")
    parser.add_argument("--levels", default="1,4,16", help="closed-loop clients per level, comma-separated")
    parser.add_argument("--requests-per-client", type=int, default=100,
                        help="per level (a level of CTranslate2 at 16 clients lasts seconds: fewer are noise)")
    parser.add_argument("--sentences", type=Path, default=Path("data/corpus/test_2016_flickr.en"),
                        help="one source sentence a line (default: the test set; else 10 built-in captions)")
    from pipeline.serving.server.__main__ import default_ct2_threads, default_threads

    inter, intra = default_ct2_threads()
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="torch threads of our server on torch, MLflow's and the references (default: the "
                             "server's)")
    parser.add_argument("--inter-threads", type=int, default=inter, help="CTranslate2's (default: the server's)")
    parser.add_argument("--intra-threads", type=int, default=intra, help="CTranslate2's (default: the server's)")
    parser.add_argument("--engines", help="our server's engines, comma-separated (default: the version's, then "
                                          "the other where it can decode)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="runs of the lowest and the top level on CTranslate2, each between two halves of its "
                             "reference: the goals' ratios pool them, each round's printed (a shared machine's load "
                             "moves within seconds)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="per level and server")
    parser.add_argument("--swap-clients", type=int, default=16, help="clients during the live swap")
    parser.add_argument("--no-mlflow", action="store_true", help="skip MLflow's server (no ratio)")
    parser.add_argument("--no-swap", action="store_true", help="skip the live swap")
    parser.add_argument("--server-cpus", help="cores for the servers, comma-separated; the clients and the in-process "
                                              "references keep the others, as if on another machine (set the "
                                              "threads to fit: a reference gets the same threads on as many cores)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.server_cpus:
        global SERVER_CPUS
        SERVER_CPUS = {int(c) for c in args.server_cpus.split(",")}
        others = os.sched_getaffinity(0) - SERVER_CPUS
        if not SERVER_CPUS <= os.sched_getaffinity(0) or not others:
            parser.error(f"--server-cpus {args.server_cpus}: not a strict subset of this process's cores "
                         f"{sorted(os.sched_getaffinity(0))}")
        os.sched_setaffinity(0, others)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the servers it started stop too (finally)
    from pipeline.config.loader import PARAMS
    from pipeline.config.params import load_params

    name = args.name or (load_params(PARAMS).tracking.registered_model if PARAMS.is_file()
                         else "transformer")
    v = served_version(name)
    engines = args.engines.split(",") if args.engines else \
        [v.decoding.engine, *[e for e in ("ctranslate2", "torch") if e != v.decoding.engine]]
    engines = [e for e in engines if e == "torch" or v.exported]   # no export: CTranslate2 cannot decode it
    sentences = SENTENCES
    if args.sentences.is_file():
        sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    levels = [int(x) for x in args.levels.split(",")]
    d = v.decoding
    pinned = f" (servers on cores {sorted(SERVER_CPUS)}, clients and references on the others)" if SERVER_CPUS \
        else ""
    cores = len(os.sched_getaffinity(0)) + len(SERVER_CPUS or ())
    print(f"{cpu_name()}, {cores} cores{pinned}; {name} version {v.version} ({v.why}): {d.engine}"
          f"{' ' + d.compute_type if d.engine == 'ctranslate2' else ''}, beam {d.beam_size}, alpha {d.alpha}, "
          f"stopping {d.stopping}{'' if v.exported else ', no CTranslate2 export'}; threads: torch {args.threads}, "
          f"CTranslate2 {args.inter_threads} x {args.intra_threads}; one-sentence requests from {len(sentences)} "
          f"sentences, {args.requests_per_client} per client", flush=True)
    options = ["--threads", str(args.threads), "--inter-threads", str(args.inter_threads), "--intra-threads",
               str(args.intra_threads)]
    refs = {e: Reference(v, e, args.threads, (args.inter_threads, args.intra_threads)) for e in engines}
    servers = [(f"ours {e}", "pipeline.serving.server", [*options, "--engine", e]) for e in engines]
    if not args.no_mlflow:
        servers.append(("mlflow", "pipeline.serving.mlflow_server", ["--version", v.version]))
    results: dict[tuple[str, int], LoadResult] = {}
    measured: dict[str, float] = {}
    for label, module, server_options in servers:
        process, url = start(module, name, server_options, args.threads)
        try:
            post(url, {"inputs": [sentences[0]]})   # warm-up
            engine, raw, rounds = label.removeprefix("ours "), [], []
            halves = (sentences[:OFFLINE], sentences[OFFLINE:2 * OFFLINE] or sentences[:OFFLINE])
            offline: list[tuple[int, float]] = []   # (sentences, seconds) of each offline half
            top_rounds: list[float] = []
            for clients in levels:
                # The two goals' levels on CTranslate2 run in rounds, each between two halves of its
                # reference, under the same load of a shared machine: raw CTranslate2 on the sentences
                # the lowest level sends (its requests cycle through them), offline batches at the top.
                paired = engine == "ctranslate2" and clients == min(levels)
                at_top = engine == "ctranslate2" and clients == max(levels)
                result = LoadResult()
                sent = [sentences[i % len(sentences)] for i in range(clients * args.requests_per_client)]
                for _ in range(args.rounds if paired or at_top else 1):
                    before = refs[engine].raw_times(sent[:len(sent) // 2]) if paired else []
                    offline_round = [(len(halves[0]), refs[engine].offline_seconds(halves[0]))] if at_top else []
                    one = run_load(url, sentences, clients * args.requests_per_client, clients,
                                   time_limit_s=args.time_limit)
                    raw_round = before + (refs[engine].raw_times(sent[len(sent) // 2:]) if paired else [])
                    offline_round += [(len(halves[1]), refs[engine].offline_seconds(halves[1]))] if at_top else []
                    result.merge(one)
                    raw += raw_round
                    offline += offline_round
                    if raw_round and one.latencies_s:
                        rounds.append(statistics.median(one.latencies_s) / statistics.median(raw_round))
                    if offline_round:
                        top_rounds.append(one.sentences_per_s / rate(offline_round))
                results[(label, clients)] = result
                print(f"{label:16s} clients={clients:<3d} {result.summary()}", flush=True)
                for problem in result.errors[:3]:
                    print(f"  error: {problem}")
            if raw:
                measured["raw_s"] = statistics.median(raw)
                print(f"raw CTranslate2 in-process (translate_batch, same compute type and threads), one sentence, "
                      f"just before and after {min(levels)} client(s): p50_ms={1000 * measured['raw_s']:.1f}; "
                      f"{min(levels)} client(s) over raw, each round: {' '.join(f'{r:.2f}' for r in rounds)}",
                      flush=True)
                measured["rounds"] = rounds
            if offline:
                measured[f"{engine}_offline"] = rate(offline)
                measured["top_rounds"] = top_rounds
                print(f"offline CTranslate2 in-process (batches of 16), just before and after {max(levels)} client(s): "
                      f"sentences_per_s={measured[f'{engine}_offline']:.1f}; {max(levels)} client(s) over offline, "
                      f"each round: {' '.join(f'{r:.2f}' for r in top_rounds)}", flush=True)
        finally:
            stop(process)
        if label.startswith("ours "):   # the same engine in this process, now that its server is gone
            ref = refs[engine]
            if f"{engine}_offline" not in measured:
                measured[f"{engine}_offline"] = ref.offline(sentences[:2 * OFFLINE])
            print(f"reference {engine} in-process, one sentence: p50_ms={1000 * ref.one(sentences[:60]):.1f}; "
                  f"offline, batches of 16: sentences_per_s={measured[f'{engine}_offline']:.1f}", flush=True)
    if not args.no_swap:
        swap, answered = swap_under_load(v, options, args.threads, args.swap_clients, sentences)
        results[("swap", args.swap_clients)] = swap
        print(f"swap under load ({args.swap_clients} clients, {v.decoding.engine}): {swap.summary()} {answered}",
              flush=True)
        for problem in swap.errors[:3]:
            print(f"  error: {problem}")
    top = max(levels)
    if "raw_s" in measured:
        ours = {c: results[("ours ctranslate2", c)] for c in levels}
        one = statistics.median(ours[min(levels)].latencies_s or [math.nan])
        spread = f", each {min(measured['rounds']):.2f}-{max(measured['rounds']):.2f}" if measured["rounds"] else ""
        print(f"one_client_p50_vs_raw={one / measured['raw_s']:.2f} (goal <= 1.25; {len(measured['rounds'])} "
              f"rounds pooled{spread})")
        each = measured["top_rounds"]
        print(f"top_vs_offline={ours[top].sentences_per_s / measured['ctranslate2_offline']:.2f} (goal >= 0.9; "
              f"{len(each)} rounds pooled, each {min(each):.2f}-{max(each):.2f})")
        if ("ours torch", top) in results:
            print(f"top_vs_torch_server={ours[top].sentences_per_s / results[('ours torch', top)].sentences_per_s:.2f}"
                  " (goal >= 2)")
        if 4 in ours and 1 in ours:
            print(f"p95_4_vs_p50_1={ours[4].percentile(95) / ours[1].percentile(50):.2f} (goal <= 3)")
    print(f"errors={sum(len(r.errors) for r in results.values())}")
    if not args.no_mlflow:
        mine = results[(f"ours {v.decoding.engine if v.decoding.engine in engines else engines[0]}", top)]
        print(f"ratio={mine.sentences_per_s / results[('mlflow', top)].sentences_per_s:.2f}")


if __name__ == "__main__":
    main()
