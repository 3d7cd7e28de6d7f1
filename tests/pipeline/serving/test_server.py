"""pipeline/serving/server (``make serve-model``): a real server process on a free 127.0.0.1 port
serving a tiny model registered in a temporary SQLite store, real HTTP: MLflow's formats and 400s,
batched decoding equal to one by one with batches really formed (read from /metrics), 413, 429 and
the deadline (a decode slowed on purpose), the live swap under load with no failed request, and
SIGTERM draining the queue."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.translator import Translator, load_translator
from pipeline.tracking.store import CHAMPION_ALIAS

from ..conftest import MIRROR, REPO
from .test_mlflow_server import NAME, SOURCES, _free_port, _lines, registered_in_temp_store

pytestmark = [pytest.mark.service, pytest.mark.training]


@dataclass
class Server:
    process: subprocess.Popen
    base: str
    log: Path

    @property
    def url(self) -> str:
        return f"{self.base}/invocations"

    def get(self, path: str, **headers: str) -> tuple[int, bytes, dict]:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{self.base}{path}", headers=headers),
                                        timeout=30) as r:
                return r.status, r.read(), r.headers
        except urllib.error.HTTPError as err:
            return err.code, err.read(), err.headers

    def post(self, payload, timeout: float = 60) -> tuple[int, dict, dict]:
        request = urllib.request.Request(self.url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}"), err.headers

    def metrics(self, **headers: str) -> dict[str, float]:
        values = {}
        for family in text_string_to_metric_families(self.get("/metrics", **headers)[1].decode()):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
        return values

    def stop(self) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()


def start_server(root: Path, uri: str, *args: str) -> Server:
    port = _free_port()
    log = root / f"server-{port}.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "pipeline.serving.server", "--name", NAME, "--port",
                                    str(port), "--threads", "1", *args], cwd=root, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, f"the server exited ({process.returncode}): {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        try:
            if server.get("/health/ready")[0] == 200:
                return server
        except OSError:
            time.sleep(0.3)


@dataclass
class Registered:
    root: Path
    uri: str
    client: MlflowClient
    run_id: str
    translator: Translator


@pytest.fixture(scope="module")
def registered(tmp_path_factory) -> Registered:
    root, uri, run_id, model_file, tokenizer_file = registered_in_temp_store(tmp_path_factory, "server")
    translator = load_translator(model_file, tokenizer_file, DecodingConfig(beam_size=2, alpha=0.6, max_len_b=12),
                                 device="cpu")
    return Registered(root, uri, MlflowClient(uri, uri), run_id, translator)


@pytest.fixture(scope="module")
def server(registered) -> Server:
    s = start_server(registered.root, registered.uri, "--poll-seconds", "0.5")
    yield s
    assert s.stop() == 0, s.log.read_text()[-2000:]


def test_ready_version_and_the_version_header(server, registered):
    assert server.get("/health/live")[0] == 200 and server.get("/ping")[0] == 200
    status, body, _ = server.get("/version")
    version = json.loads(body)
    assert status == 200 and (version["version"], version["alias"], version["run_id"]) == ("1", "champion",
                                                                                             registered.run_id)
    status, body, headers = server.post({"dataframe_records": [{"text": SOURCES[0]}]})
    assert status == 200 and headers["X-Model-Version"] == "1"
    assert f"serving {NAME} version 1 (alias champion; run {registered.run_id})" in server.log.read_text()


def test_mlflow_request_formats_translate_like_the_translator(server, registered):
    expected = registered.translator.translate(SOURCES)
    for payload in ({"dataframe_records": [{"text": s} for s in SOURCES]},
                    {"dataframe_split": {"columns": ["text"], "data": [[s] for s in SOURCES]}},
                    {"inputs": {"text": SOURCES}}, {"inputs": SOURCES}, {"instances": SOURCES}):
        status, body, _ = server.post(payload)
        assert (status, body.get("predictions")) == (200, expected), (payload, body)
    status, body, _ = server.post({"inputs": SOURCES, "params": {"beam_size": 1}})
    assert body["predictions"] == registered.translator.translate(SOURCES, beam_size=1)
    status, body, _ = server.post({"inputs": SOURCES, "params": {"stopping": "fairseq"}})
    assert body["predictions"] == registered.translator.translate(SOURCES, stopping="fairseq")


@pytest.mark.parametrize("payload, message", [
    ({"dataframe_records": [{"text": "A dog."}, {"text": ""}]}, "text[1] is empty"),
    ({"dataframe_records": [{"text": 42}]}, "42"),
    ({"dataframe_records": [{"text": "word " * 300}]}, "has 1500 characters; at most 1000"),
    ({"dataframe_records": [{"text": "A dog."}], "params": {"beam_size": 99}}, "beam_size must be between 1 and 16"),
    ({"inputs": ["A dog."], "params": {"stopping": "soon"}}, "stopping must be one of exact, fairseq, got str 'soon'"),
    ({"dataframe_records": [{"text": "A dog."}] * 300}, "300 sentences in one request; at most 256"),
    ({"text": "A dog."}, "exactly one of dataframe_records"),
])
def test_bad_inputs_get_the_pyfunc_models_400(server, payload, message):
    status, body, headers = server.post(payload)
    assert status == 400 and message in body["message"], body
    assert headers["X-Model-Version"] == "1"


def test_malformed_json_is_a_400_and_an_oversized_body_a_413_unparsed(server):
    request = urllib.request.Request(server.url, b'{"inputs": ["A dog.', {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 400 and json.loads(err.value.read())["error_code"] == "MALFORMED_REQUEST"
    status, body, _ = server.post({"inputs": ["x" * 900] * 1300})   # 1.2 MB
    assert status == 413 and "over 1048576 bytes" in body["message"]


def test_concurrent_requests_are_batched_and_equal_one_by_one(server, registered):
    raw = MIRROR / "data/task1/raw"
    sentences = _lines(raw / "test_2016_flickr.en.gz", 48) if (raw / "test_2016_flickr.en.gz").is_file() \
        else SOURCES * 16
    one_by_one = [registered.translator.translate([s])[0] for s in sentences]
    before = server.metrics()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda s: server.post({"inputs": [s]}), sentences))
    assert all(status == 200 for status, _, _ in answers)
    served = [body["predictions"][0] for _, body, _ in answers]
    differences = [(s, a, b) for s, a, b in zip(sentences, served, one_by_one) if a != b]
    assert differences == [], differences   # fp32: padding in a batch changes no token
    after = server.metrics()
    batches = after["translation_batch_sentences_count"] - before.get("translation_batch_sentences_count", 0)
    decoded = after["translation_batch_sentences_sum"] - before.get("translation_batch_sentences_sum", 0)
    assert decoded == len(sentences) and batches < len(sentences), (batches, decoded)   # batches above 1 formed
    assert after["translation_requests_total{status=200}"] >= len(sentences)


def test_a_full_queue_answers_429_and_a_passed_deadline_503_undecoded(registered):
    slow = start_server(registered.root, registered.uri, "--decode-delay-ms", "800", "--max-queue-sentences", "2",
                        "--deadline-seconds", "0.4", "--poll-seconds", "60")
    try:
        def one(i: int):
            time.sleep(0.05 * i)   # in order: the first is decoding while the next queue up
            return slow.post({"inputs": [SOURCES[i % 3]]})
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(one, range(6)))
        statuses = [status for status, _, _ in answers]
        assert statuses[0] == 200 and statuses.count(429) >= 2 and statuses.count(503) >= 1, statuses
        assert all(headers.get("Retry-After") == "1" for status, _, headers in answers if status in (429, 503))
        metrics = slow.metrics()
        assert metrics["translation_batch_sentences_sum"] == statuses.count(200)   # the 503s were not decoded
        assert ("warning: --max-queue-sentences 2 is below the 256 sentences a request may hold: a larger request "
                "is answered 413 (split it)") in slow.log.read_text()
    finally:
        assert slow.stop() == 0


def test_sigterm_answers_what_is_queued_then_exits_0(registered):
    slow = start_server(registered.root, registered.uri, "--decode-delay-ms", "500", "--poll-seconds", "60")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(slow.post, {"inputs": [s]}) for s in SOURCES]
        time.sleep(0.3)   # accepted and queued
        os.killpg(slow.process.pid, signal.SIGTERM)
        answers = [f.result() for f in pending]
    assert [status for status, _, _ in answers] == [200] * len(SOURCES)
    assert slow.process.wait(timeout=60) == 0


def test_the_load_bench_runs_both_servers_at_each_level(registered):
    """Version 1 has no CTranslate2 export: our server runs on torch only (the CTranslate2 path of the
    bench: test_server_engines); the live swap runs on a temporary copy of the registry."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--name", NAME, "--levels", "1,2",
                           "--requests-per-client", "4", "--threads", "1", "--swap-clients", "2"], cwd=registered.root,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": registered.uri})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert f"{NAME} version 1 (alias champion): torch" in lines[0] and "no CTranslate2 export" in lines[0]
    for label in ("ours torch", "mlflow"):
        for clients in (1, 2):
            (line,) = [x for x in lines if re.match(rf"{label} +clients={clients} ", x)]
            assert f"requests={4 * clients} errors=0" in line and "p99_ms=" in line, line
    assert not [x for x in lines if x.startswith("ours ctranslate2")]
    (swap,) = [x for x in lines if x.startswith("swap under load (2 clients, torch): ")]
    assert " errors=0 " in swap and re.search(r" versions=1:[1-9]\d*,2:[1-9]\d* ", swap), swap
    assert any(x.startswith("reference torch in-process, one sentence: p50_ms=") and
               "offline, batches of 16: sentences_per_s=" in x for x in lines)
    assert "errors=0" in lines and lines[-1].startswith("ratio=") and float(lines[-1].split("=")[1]) > 0


def test_the_champion_is_swapped_live_under_load_without_a_failed_request(server, registered):
    stop, results, lock = threading.Event(), [], threading.Lock()

    def client() -> None:
        while not stop.is_set():
            status, body, headers = server.post({"inputs": [SOURCES[1]]})
            with lock:
                results.append((status, headers.get("X-Model-Version")))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        registered.client.set_registered_model_alias(NAME, CHAMPION_ALIAS, "2")
        deadline = time.monotonic() + 60
        while json.loads(server.get("/version")[1])["version"] != "2":
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join()
        registered.client.set_registered_model_alias(NAME, CHAMPION_ALIAS, "1")
    statuses = [status for status, _ in results]
    versions = [version for _, version in results]
    assert statuses.count(200) == len(results) and len(results) > 20, statuses
    assert versions[0] == "1" and versions[-1] == "2" and set(versions) == {"1", "2"}
    assert server.metrics()["translation_model_swaps_total"] >= 1
    assert "serving serve-test version 2 (alias champion" in server.log.read_text()
