"""pipeline/serving/server when the inference side stops answering: ``/health/ready`` turns 503 and
every waiting request is answered within its bound (``deadline_seconds + stall_seconds``).

The real app (``create_app``) on uvicorn in this process, bound to a free 127.0.0.1 port, real HTTP;
a tiny random model with its real tokenizer. The hang and the crash are fakes of the decoder, and
only here: ``Hanging`` wraps the real translator and its ``translate_ids`` blocks on an Event (or
raises what no batch's error handling catches), which no real decoder can be made to do on demand.
Also the share-out of a burst between CTranslate2's replicas (no HTTP), and the app's front door:
``POST /invocations`` answered ahead of FastAPI's stack, every other request still FastAPI's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import torch
import uvicorn

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.server.app import ServerSettings, ServerState, create_app
from pipeline.serving.server.batcher import Batcher, Job
from pipeline.serving.server.metrics import ServerMetrics
from pipeline.serving.server.model_source import ServedModel
from pipeline.serving.translator import Translator
from transformer.config import build_config
from transformer.model import Transformer
from transformer.tokenizer import open_tokenizer

from . import test_export as exported
from .test_export import VOCAB
from .test_mlflow_server import _free_port
from .test_server import Server

pytestmark = pytest.mark.fast

tokenizer_file = exported.tokenizer_file   # the export tests' 24-piece SentencePiece model
DECODING = DecodingConfig(beam_size=1, max_len_b=4)
DEADLINE_S, STALL_S = 0.5, 1.5
SLACK_S = 2.0   # HTTP and thread hand-offs on a loaded machine, beyond the bound itself


class DecoderCrash(BaseException):
    """What escapes a batch's own error handling (which catches Exception): the thread ends."""


class Hanging:
    """A fake of the decoder, for these tests only: the real translator, but ``translate_ids``
    blocks until ``release`` is set, or raises ``crash`` when given."""

    def __init__(self, real: Translator, crash: BaseException | None = None) -> None:
        self.real, self.crash = real, crash
        self.entered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str):   # noqa: ANN204 - the tokenizer, decoding, limits: the real ones
        return getattr(self.real, name)

    def translate_ids(self, ids, **settings):   # noqa: ANN001, ANN003, ANN201
        self.entered.set()
        if self.crash is not None:
            raise self.crash
        self.release.wait()
        return self.real.translate_ids(ids, **settings)


def tiny_translator(tokenizer_file, decoding: DecodingConfig = DECODING) -> Translator:   # noqa: ANN001
    """A tiny random model (seed 0) with the export tests' real tokenizer."""
    torch.manual_seed(0)
    return Translator(Transformer(build_config("tiny", VOCAB)).eval(), open_tokenizer(tokenizer_file), decoding,
                      packed=False)


@pytest.fixture
def translator(tokenizer_file) -> Translator:
    return tiny_translator(tokenizer_file)


def state_of(translator, max_queue_sentences: int = 512, **settings) -> ServerState:   # noqa: ANN001, ANN003
    """The app's state around ``translator``: this module's bounds unless ``settings`` says otherwise."""
    model = ServedModel("health", "1", "alias champion", "run", translator)
    settings = ServerSettings("health", "sqlite:///unused.db", **{
        "poll_seconds": 3600, "deadline_seconds": DEADLINE_S, "drain_seconds": 1.0, "stall_seconds": STALL_S,
        **settings})
    metrics = ServerMetrics()
    batcher = Batcher(max_queue_sentences, threads=1, on_batch=metrics.on_batch, stall_seconds=settings.stall_seconds)
    state = ServerState(settings, model, batcher, metrics)
    state.set_current(model)
    return state


def serve(translator, middleware: tuple = (), state: ServerState | None = None,   # noqa: ANN001
          **settings) -> tuple[Server, uvicorn.Server, threading.Thread]:   # noqa: ANN003
    """The real app on uvicorn in a thread of this process, on a free 127.0.0.1 port; ``middleware``
    (pairs of a class and its keyword arguments) added to the app before it starts."""
    app = create_app(state or state_of(translator, **settings))
    for middleware_class, kwargs in middleware:
        app.add_middleware(middleware_class, **kwargs)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.05)
    return Server(None, f"http://127.0.0.1:{port}", None), server, thread   # type: ignore[arg-type]


@pytest.fixture
def running() -> Iterator[list]:
    """Stops what ``serve`` started (the hang released first), whatever the test did."""
    started: list = []
    yield started
    for fake, server, thread in started:
        fake.release.set()
        server.should_exit = True
        thread.join(30)


def timed(server: Server, payload: dict) -> tuple[int, dict, float]:
    begun = time.monotonic()
    status, body, _ = server.post(payload, timeout=60)
    return status, body, time.monotonic() - begun


def ready(server: Server) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.base}/health/ready", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.service
def test_a_hung_decoder_makes_ready_503_and_every_waiting_request_is_answered_within_its_bound(translator, running):
    fake = Hanging(translator)
    http, server, thread = serve(fake)
    running.append((fake, server, thread))
    assert ready(http) == (200, "\n")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        hung = pool.submit(timed, http, {"inputs": ["ab cd"]})
        assert fake.entered.wait(10)
        queued = pool.submit(timed, http, {"inputs": ["ef gh"]})   # behind the hung batch: the one thread is busy
        status, body, waited = queued.result()
        assert status == 503 and body["error_code"] == "TEMPORARILY_UNAVAILABLE" and "not decoded" in body["message"]
        assert waited <= DEADLINE_S + SLACK_S
        status, body, waited = hung.result()
        assert status == 504 and body["error_code"] == "DEADLINE_EXCEEDED", body
        assert waited <= DEADLINE_S + STALL_S + SLACK_S
        status, text = ready(http)
        assert status == 503 and "inference-0 has been decoding one batch (1 sentences)" in text, text
        late = pool.submit(timed, http, {"inputs": ["ab"]})   # arrives during the stall: answered too
        status, body, waited = late.result()
        assert status == 503 and waited <= DEADLINE_S + SLACK_S
    fake.release.set()   # the decoder comes back: ready again, and it translates
    deadline = time.monotonic() + 10
    while ready(http)[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, body, _ = timed(http, {"inputs": ["ab cd", "ef gh"]})
    assert (status, body["predictions"]) == (200, translator.translate(["ab cd", "ef gh"]))


@pytest.mark.service
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_inference_thread_makes_ready_503_and_requests_503_at_once(translator, running):
    fake = Hanging(translator, crash=DecoderCrash("simulated"))
    http, server, thread = serve(fake)
    running.append((fake, server, thread))
    status, body, _ = timed(http, {"inputs": ["ab cd"]})
    assert status == 503 and "the inference thread died: DecoderCrash: simulated" in body["message"], body
    status, text = ready(http)
    assert status == 503 and "the inference thread inference-0 died (DecoderCrash: simulated)" in text, text
    status, body, waited = timed(http, {"inputs": ["ef gh"]})
    assert status == 503 and "died" in body["message"] and waited < DEADLINE_S   # refused, not queued


@pytest.mark.service
def test_invocations_is_answered_ahead_of_fastapi_and_every_other_request_is_still_fastapis(translator, running):
    fake = Hanging(translator)
    fake.release.set()   # decodes at once
    http, server, thread = serve(fake)
    running.append((fake, server, thread))
    status, body, headers = http.post({"inputs": ["ab cd", "ef"]})
    assert status == 200 and len(body["predictions"]) == 2 and headers["X-Model-Version"] == "1", body
    assert headers["Content-Type"] == "application/json"
    status, body, _ = http.post({"text": ["ab"]})   # the pyfunc format's checks, in the handler
    assert status == 400 and body["error_code"] == "BAD_REQUEST", body
    counted = http.metrics()
    assert counted['translation_requests_total{status=200}'] == 1
    assert counted['translation_requests_total{status=400}'] == 1
    status, body, _ = http.get("/invocations")   # another method: FastAPI's router answers
    assert status == 405 and b"Method Not Allowed" in body, body
    status, schema, _ = http.get("/openapi.json")   # and its schema still lists the route
    assert status == 200 and "post" in json.loads(schema)["paths"]["/invocations"]
    status, body, _ = http.get("/version")
    assert status == 200 and json.loads(body)["version"] == "1"


class Replicas:
    """A served version whose engine decodes two batches at once (CTranslate2's inter_threads 2)."""

    concurrency = 2

    def __init__(self, translator: Translator) -> None:
        self.translator, self.batches = self, []
        self.real = translator
        self.tokenizer = translator.tokenizer

    def translate_ids(self, ids, **settings):   # noqa: ANN001, ANN003, ANN201
        self.batches.append(len(ids))
        return self.real.translate_ids(ids, **settings)


def test_a_burst_is_shared_out_between_free_replicas(translator):
    model = Replicas(translator)
    # Each replica's first batch waits until the other's has begun: a thread scheduled late (a busy
    # machine) would otherwise find the first already done and both free again (8, 4, 4). The split is
    # the batcher's; the barrier only makes "both free when the burst came" hold on any machine.
    both_began, decode, calls = threading.Barrier(2, timeout=30), model.translate_ids, []

    def meets_the_other(ids, **settings):   # noqa: ANN001, ANN003, ANN202
        calls.append(len(ids))
        if len(calls) <= 2:
            try:
                both_began.wait()
            except threading.BrokenBarrierError:   # no second batch: the split below says what happened
                pass
        return decode(ids, **settings)
    model.translate_ids = meets_the_other
    batcher = Batcher(threads=1, workers=2)
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job([[5, 6, 7]], model, DECODING, time.monotonic() + 60, loop.create_future(), loop)
                for _ in range(16)]
        for job in jobs:
            batcher.submit(job)   # queued before the threads start: a burst
        batcher.start()
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 60))
    finally:
        batcher.stop(10)
        loop.close()
    assert sorted(model.batches) == [8, 8] and batcher.problem() is None


def test_a_free_replica_waits_a_moment_for_as_many_sentences_as_the_busy_one_decodes(translator):
    """While one replica decodes 4 sentences, requests trickling in are decoded as one batch of 4,
    not one by one (the wait ends as soon as as many are queued, well within ``batch_wait_s``)."""
    model = Replicas(translator)
    gate, entered, calls = threading.Event(), threading.Event(), []
    decode = model.translate_ids

    def first_blocks(ids, **settings):   # noqa: ANN001, ANN003, ANN202
        calls.append(len(ids))
        if len(calls) == 1:   # the busy replica, until the others are queued
            entered.set()
            gate.wait(30)
        return decode(ids, **settings)
    model.translate_ids = first_blocks
    batcher = Batcher(threads=1, workers=2, batch_wait_s=5.0)
    loop = asyncio.new_event_loop()
    try:
        def job(sentences: int) -> Job:
            j = Job([[5, 6, 7]] * sentences, model, DECODING, time.monotonic() + 60, loop.create_future(), loop)
            batcher.submit(j)
            return j
        batcher.start()
        jobs = [job(4)]
        assert entered.wait(10)
        began = time.monotonic()
        for _ in range(4):
            jobs.append(job(1))
            time.sleep(0.05)
        gate.set()
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*(j.future for j in jobs)), 60))
    finally:
        gate.set()
        batcher.stop(10)
        loop.close()
    assert model.batches == [4, 4] and time.monotonic() - began < 5.0, model.batches
