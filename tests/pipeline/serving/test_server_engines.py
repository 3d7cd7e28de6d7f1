"""pipeline/serving/server with each decoding engine: a real server process on a free 127.0.0.1 port,
real HTTP, a tiny model trained here and registered in a temporary SQLite store.

Versions: 1 and 2 as the evaluate stage registered them before the engine was a setting (no
CTranslate2 export: served with torch), 3 and 4 registered by the evaluate stage's ``log_translator``
with engine ctranslate2 int8 and the export (``artifacts/ctranslate2/`` in the version): 3 from the
training's run (registered twice: one version), 4 from a run of the same params.
The CTranslate2 version's answers equal an in-process ``CT2Translator`` of the same export and
settings, one request of several sentences and concurrent one-sentence requests (batched across
requests, two replicas); the champion moves torch -> ctranslate2 -> ctranslate2 under load with no
failed request and each swapped-out version drained and released; bench/serve_load.py runs our server
with each engine and MLflow's on the CTranslate2 version."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Param

from pipeline.config.decoding import TUNED, DecodingConfig
from pipeline.pyfunc.log_version import log_translator
from pipeline.serving.ct2_translator import CT2Translator, load_ct2_translator
from pipeline.serving.export import export_ctranslate2
from pipeline.serving.translator import Translator, load_translator
from pipeline.tracking.store import CHAMPION_ALIAS
from transformer.checkpoint import load_model

from ..conftest import MIRROR, REPO
from .test_mlflow_server import NAME, SOURCES, _lines, registered_in_temp_store
from .test_server import start_server

pytestmark = [pytest.mark.service, pytest.mark.training]

CT2 = DecodingConfig(beam_size=2, alpha=0.6, max_len_b=12, stopping="fairseq", engine="ctranslate2",
                     compute_type="int8")
SERVER_THREADS = ("--threads", "1", "--inter-threads", "2", "--intra-threads", "1")


def register_ct2(root: Path, uri: str, run_id: str, model_file: Path, tokenizer_file: Path,
                 decoding: DecodingConfig) -> str:
    """Register the model with its CTranslate2 export as the evaluate stage does when tune chose
    ctranslate2 (``log_translator``): ``artifacts/ctranslate2/`` beside the checkpoint and the
    tokenizer, the engine in the settings. Returns the version."""
    exported = export_ctranslate2(load_model(model_file), tokenizer_file, root / "exported")
    chosen = {key: getattr(decoding, key) for key in TUNED}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(root)
        return log_translator(run_id, model_file, tokenizer_file, NAME, chosen, metrics_file=root / "scores.json",
                              corpus_stats_file=root / "missing-stats.json", ct2_model=exported)


class Store:
    def __init__(self, root: Path, uri: str, torch_translator: Translator, ct2: CT2Translator) -> None:
        self.root, self.uri, self.torch, self.ct2 = root, uri, torch_translator, ct2
        self.client = mlflow.tracking.MlflowClient(uri, uri)

    def champion(self, version: str) -> None:
        self.client.set_registered_model_alias(NAME, CHAMPION_ALIAS, version)


def rerun_of(uri: str, run_id: str) -> str:
    """A new run of ``run_id``'s experiment with its params and tags: the pipeline run once more."""
    client = mlflow.tracking.MlflowClient(uri, uri)
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    rerun = client.create_run(run.info.experiment_id, tags=tags, run_name=f"{run.info.run_name}-again").info.run_id
    client.log_batch(rerun, params=[Param(k, v) for k, v in run.data.params.items()])
    return rerun


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    root, uri, run_id, model_file, tokenizer_file = registered_in_temp_store(tmp_path_factory, "engines")
    # The same model from the same run with the same settings is one version; the pipeline run
    # again (another run, the same params and bytes) registers another: two versions that translate alike.
    versions = [register_ct2(root, uri, run, model_file, tokenizer_file, CT2)
                for run in (run_id, run_id, rerun_of(uri, run_id))]
    assert versions == ["3", "3", "4"], versions
    ours = load_translator(model_file, tokenizer_file, DecodingConfig(beam_size=2, alpha=0.6, max_len_b=12),
                           device="cpu")
    theirs = load_ct2_translator(root / "exported", tokenizer_file, CT2, ours.model.config.max_positions,
                                 threads=(1, 1))
    return Store(root, uri, ours, theirs)


def test_a_ctranslate2_version_answers_as_its_translator_in_process(store):
    store.champion("3")
    server = start_server(store.root, store.uri, *SERVER_THREADS, "--poll-seconds", "60")
    try:
        version = json.loads(server.get("/version")[1])
        assert (version["version"], version["engine"], version["compute_type"], version["threads"]) == \
            ("3", "ctranslate2", "int8", "2 x 1")
        assert "version 3 (alias champion" in server.log.read_text() and "with ctranslate2 int8 (2 x 1 threads)" in \
            server.log.read_text()
        status, body, headers = server.post({"inputs": SOURCES})
        assert (status, body["predictions"], headers["X-Model-Version"]) == (200, store.ct2.translate(SOURCES), "3")
        status, body, _ = server.post({"inputs": SOURCES, "params": {"beam_size": 1}})
        assert body["predictions"] == store.ct2.translate(SOURCES, beam_size=1)
        status, body, _ = server.post({"inputs": SOURCES, "params": {"stopping": "exact"}})
        assert status == 400 and "stopping exact is our search's rule" in body["message"], body

        raw = MIRROR / "data/task1/raw/test_2016_flickr.en.gz"
        sentences = _lines(raw, 48) if raw.is_file() else SOURCES * 16
        one_by_one = [store.ct2.translate([s])[0] for s in sentences]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda s: server.post({"inputs": [s]}), sentences))
        assert [status for status, _, _ in answers] == [200] * len(sentences)
        differences = [(s, body["predictions"][0], b) for s, (_, body, _), b in zip(sentences, answers, one_by_one)
                       if body["predictions"][0] != b]
        assert differences == [], differences   # a batch's padding changes no sentence's tokens
        metrics = server.metrics()
        assert metrics["translation_batch_sentences_count"] < metrics["translation_batch_sentences_sum"]   # batched
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]


def test_a_version_without_export_is_served_with_torch(store):
    store.champion("1")
    server = start_server(store.root, store.uri, *SERVER_THREADS, "--poll-seconds", "60")
    try:
        assert json.loads(server.get("/version")[1])["engine"] == "torch"
        status, body, _ = server.post({"inputs": SOURCES})
        assert (status, body["predictions"]) == (200, store.torch.translate(SOURCES))
        log = server.log.read_text()
        assert "version 1 (alias champion" in log and "with torch, 1 thread(s)" in log
        assert "warning: decoding with torch instead" not in log   # no fallback: torch is its engine
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]


def test_live_swaps_torch_to_ctranslate2_to_ctranslate2_under_load_fail_no_request(store):
    store.champion("1")
    server = start_server(store.root, store.uri, *SERVER_THREADS, "--poll-seconds", "0.3")
    stop, results, lock = threading.Event(), [], threading.Lock()

    def client(i: int) -> None:
        while not stop.is_set():
            status, body, headers = server.post({"inputs": [SOURCES[i % len(SOURCES)]]})
            with lock:
                results.append((status, headers.get("X-Model-Version"), i % len(SOURCES), body.get("predictions")))

    def serving(version: str) -> None:
        deadline = time.monotonic() + 60
        while json.loads(server.get("/version")[1])["version"] != version:
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.1)
        time.sleep(1.0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        for version in ("3", "4"):
            store.champion(version)
            serving(version)
    finally:
        stop.set()
        for t in threads:
            t.join()
        store.champion("1")
    try:
        statuses = [status for status, _, _, _ in results]
        versions = [version for _, version, _, _ in results]
        assert statuses.count(200) == len(results) and len(results) > 30, statuses
        assert versions[0] == "1" and versions[-1] == "4" and set(versions) == {"1", "3", "4"}
        # Each version answers as its engine does (the CTranslate2 versions share the export).
        expected = {"1": store.torch.translate(SOURCES), "3": store.ct2.translate(SOURCES)}
        expected["4"] = expected["3"]
        assert all(body == [expected[version][i]] for _, version, i, body in results)
        assert server.metrics()["translation_model_swaps_total"] == 2
        deadline = time.monotonic() + 30
        while "version 3 drained and released" not in server.log.read_text():
            assert time.monotonic() < deadline, server.log.read_text()[-2000:]
            time.sleep(0.2)
        log = server.log.read_text()
        assert "version 1 drained and released" in log and "version 4 (alias champion" in log
        assert "with ctranslate2 int8 (2 x 1 threads), was 3" in log
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]


def test_the_load_bench_runs_each_engine_mlflows_server_and_a_swap_on_a_ctranslate2_version(store):
    store.champion("3")
    try:
        done = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--name", NAME, "--levels",
                               "1,4", "--requests-per-client", "3", "--threads", "1", "--inter-threads", "2",
                               "--intra-threads", "1", "--swap-clients", "2", "--rounds", "2"], cwd=store.root,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": store.uri})
    finally:
        store.champion("1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert f"{NAME} version 3 (alias champion): ctranslate2 int8, beam 2" in lines[0], lines[0]
    assert "CTranslate2 2 x 1" in lines[0]
    for label in ("ours ctranslate2", "ours torch", "mlflow"):
        for clients in (1, 4):
            (line,) = [x for x in lines if re.match(rf"{label} +clients={clients} ", x)]
            rounds = 2 if label == "ours ctranslate2" else 1   # the goals' levels (the lowest, the top), twice
            assert f"requests={3 * clients * rounds} errors=0" in line, line
    (swap,) = [x for x in lines if x.startswith("swap under load (2 clients, ctranslate2): ")]
    assert " errors=0 " in swap and re.search(r" versions=1:[1-9]\d*,2:[1-9]\d* ", swap), swap
    (raw,) = [x for x in lines if x.startswith("raw CTranslate2 in-process (translate_batch, same compute type and "
                                                 "threads), one sentence, just before and after 1 client(s): p50_ms=")]
    each = [float(r) for r in raw.split("each round: ")[1].split()]
    assert len(each) == 2 and min(each) > 0, raw
    for engine in ("ctranslate2", "torch"):
        assert any(x.startswith(f"reference {engine} in-process, one sentence: p50_ms=") and
                   "; offline, batches of 16: sentences_per_s=" in x for x in lines), engine
    for goal in ("one_client_p50_vs_raw=", "top_vs_offline=", "top_vs_torch_server=", "p95_4_vs_p50_1="):
        (line,) = [x for x in lines if x.startswith(goal)]
        assert float(line.split("=")[1].split()[0]) > 0, line   # printed, never asserted: a shared machine
    (ratio,) = [x for x in lines if x.startswith("one_client_p50_vs_raw=")]
    assert f"2 rounds pooled, each {min(each):.2f}-{max(each):.2f})" in ratio, ratio
    (offline,) = [x for x in lines if x.startswith("offline CTranslate2 in-process (batches of 16), just before and "
                                                   "after 4 client(s): sentences_per_s=")]
    pooled = float(offline.split("sentences_per_s=")[1].split(";")[0])
    tops = [float(r) for r in offline.split("each round: ")[1].split()]
    assert pooled > 0 and len(tops) == 2 and min(tops) > 0, offline
    (reference,) = [x for x in lines if x.startswith("reference ctranslate2 in-process")]
    assert f"sentences_per_s={pooled:.1f}" in reference, reference   # one offline figure: the rounds'
    (ratio,) = [x for x in lines if x.startswith("top_vs_offline=")]
    assert f"2 rounds pooled, each {min(tops):.2f}-{max(tops):.2f})" in ratio, ratio
    assert "errors=0" in lines and lines[-1].startswith("ratio=") and float(lines[-1].split("=")[1]) > 0


def test_the_load_bench_can_put_the_server_on_its_own_cores_and_refuses_to_leave_the_clients_none(store):
    bench = [sys.executable, str(REPO / "bench" / "serve_load.py"), "--name", NAME]
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": store.uri}
    every_core = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    refused = subprocess.run([*bench, "--server-cpus", every_core], cwd=store.root, capture_output=True, text=True,
                             timeout=120, env=env)
    assert refused.returncode == 2 and "not a strict subset of this process's cores" in refused.stderr
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: no core is left for the clients")
    server_core = min(os.sched_getaffinity(0))
    store.champion("3")   # the version with a CTranslate2 export
    try:
        done = subprocess.run([*bench, "--server-cpus", str(server_core), "--levels", "1", "--requests-per-client",
                               "3", "--engines", "ctranslate2", "--threads", "1", "--inter-threads", "1",
                               "--intra-threads", "1", "--no-mlflow", "--no-swap"], cwd=store.root, capture_output=True,
                              text=True, timeout=600, env=env)
    finally:
        store.champion("1")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert f"(servers on cores [{server_core}], clients and references on the others)" in lines[0], lines[0]
    (line,) = [x for x in lines if re.match(r"ours ctranslate2 +clients=1 ", x)]
    assert "requests=15 errors=0" in line, line   # 5 rounds (the default) of 3
    assert any(x.startswith("offline CTranslate2 in-process (batches of 16), just before and after 1 client(s)")
               for x in lines)   # one level, the lowest and the top: both references around its rounds
