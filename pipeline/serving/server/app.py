"""The HTTP endpoints. ``/invocations`` (MLflow's format; every answer names the version in
``X-Model-Version``), ``/ping`` and ``/health`` (MLflow's), ``/health/live``, ``/health/ready``
(once a version is loaded and has translated a warm-up sentence), ``/version``, ``/metrics``.

Backpressure: a body over ``max_body_bytes`` is refused (413) before it is parsed; a full queue
answers 429 with ``Retry-After``; a request still queued at its deadline answers 503 undecoded.
The registry is polled every ``poll_seconds``: when ``champion`` moves (or, without one, a newer
version arrives), the new version is loaded and warmed beside the old, then swapped in one step;
requests already accepted finish on the version they were accepted on. A version that fails to
load leaves the old one serving and says why in the log and in ``/version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.serving.server.batcher import Batcher, DeadlineExceeded, Job, QueueFull
from pipeline.serving.server.metrics import ServerMetrics
from pipeline.serving.server.model_source import ServedModel, load_version, wanted_version
from pipeline.serving.server.requests import BadRequest, checked


@dataclass
class ServerSettings:
    name: str
    tracking_uri: str
    poll_seconds: float = 30.0
    deadline_seconds: float = 30.0
    max_body_bytes: int = 1 << 20
    drain_seconds: float = 30.0


@dataclass
class ServerState:
    settings: ServerSettings
    current: ServedModel
    batcher: Batcher
    metrics: ServerMetrics
    swap_error: str = ""
    failed_versions: set[str] = field(default_factory=set)
    stop_watching: threading.Event = field(default_factory=threading.Event)

    def set_current(self, model: ServedModel) -> None:
        self.current = model   # one reference: a request takes the model once, at acceptance
        self.metrics.model.info(model.describe())

    def poll_once(self) -> None:
        """Load and swap in the version the registry now names, if it is another one."""
        from pipeline.tracking import store

        try:
            version, why, run_id = wanted_version(store.client(), self.settings.name)
        except Exception as err:   # noqa: BLE001 - registry away: keep serving what is loaded
            print(f"warning: registry poll failed: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr,
                  flush=True)
            return
        if version == self.current.version or version in self.failed_versions:
            return
        print(f"loading {self.settings.name} version {version} ({why}) beside version {self.current.version}",
              flush=True)
        try:
            model = load_version(self.settings.tracking_uri, self.settings.name, version, why, run_id)
        except Exception as err:   # noqa: BLE001 - the old version keeps serving
            self.failed_versions.add(version)
            self.swap_error = f"version {version} failed to load: {type(err).__name__}: {str(err)[:300]}"
            self.metrics.swap_failures.inc()
            print(f"error: {self.swap_error}; still serving version {self.current.version}", file=sys.stderr,
                  flush=True)
            return
        old = self.current.version
        self.set_current(model)
        self.swap_error = ""
        self.metrics.swaps.inc()
        print(f"serving {self.settings.name} version {version} ({why}; run {run_id}), was {old}", flush=True)

    def watch(self) -> None:
        while not self.stop_watching.wait(self.settings.poll_seconds):
            self.poll_once()


def error(status: int, message: str, error_code: str, version: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error_code": error_code, "message": message}, status_code=status,
                        headers={"X-Model-Version": version, **headers})


DISCARD_LIMIT = 64 << 20   # an oversized body up to this is read and dropped, so the client gets its 413


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is over ``limit`` bytes. Past the limit nothing is kept: the rest is
    read and dropped (up to ``DISCARD_LIMIT``), since a client still sending when the server closes
    the connection sees a broken pipe instead of the 413."""
    declared = request.headers.get("content-length")
    over = declared is not None and declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if over or size > limit:
            over = True
            chunks.clear()
            if size > DISCARD_LIMIT:
                break
            continue
        chunks.append(chunk)
    return None if over else b"".join(chunks)


def create_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):   # noqa: ANN202
        state.batcher.start()
        watcher = threading.Thread(target=state.watch, name="registry-poll", daemon=True)
        watcher.start()
        yield
        state.stop_watching.set()
        # uvicorn has stopped accepting and answered what was in flight; what is still queued is decoded.
        await asyncio.to_thread(state.batcher.stop, state.settings.drain_seconds)

    app = FastAPI(title="Transformer translation server", lifespan=lifespan)
    metrics = state.metrics

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        started = time.monotonic()
        model = state.current
        status, response = await _invocation(request, model)
        metrics.requests.labels(str(status)).inc()
        metrics.latency.labels(str(status)).observe(time.monotonic() - started)
        metrics.queue_depth.set(state.batcher.depth())
        return response

    async def _invocation(request: Request, model: ServedModel) -> tuple[int, Response]:
        version = model.version
        body = await read_body(request, state.settings.max_body_bytes)
        if body is None:
            return 413, error(413, f"the body is over {state.settings.max_body_bytes} bytes: split the request",
                              "REQUEST_LIMIT_EXCEEDED", version)
        try:
            parsed = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return 400, error(400, f"malformed JSON: {err}", "MALFORMED_REQUEST", version)
        try:
            ids, decoding = checked(model.translator, parsed)
        except BadRequest as err:
            return 400, error(400, err.message, err.error_code, version)
        loop = asyncio.get_running_loop()
        job = Job(ids, model, decoding, time.monotonic() + state.settings.deadline_seconds, loop.create_future(),
                  loop)
        try:
            state.batcher.submit(job)
        except QueueFull as err:
            return 429, error(429, f"too many requests queued ({err}); retry shortly", "RESOURCE_EXHAUSTED",
                              version, **{"Retry-After": "1"})
        try:
            texts = await job.future
        except DeadlineExceeded as err:
            return 503, error(503, f"not started within {state.settings.deadline_seconds:g} s ({err}); not "
                              "decoded", "TEMPORARILY_UNAVAILABLE", version, **{"Retry-After": "1"})
        except Exception as err:   # noqa: BLE001
            return 500, error(500, f"{type(err).__name__}: {err}", "INTERNAL_ERROR", version)
        return 200, JSONResponse({"predictions": texts}, headers={"X-Model-Version": version})

    @app.get("/ping")
    @app.get("/health")
    @app.get("/health/ready")
    async def ready() -> Response:
        return PlainTextResponse("\n", headers={"X-Model-Version": state.current.version})

    @app.get("/health/live")
    async def live() -> Response:
        return PlainTextResponse("\n")

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {**state.current.describe(), "swap_error": state.swap_error,
                "poll_seconds": state.settings.poll_seconds}

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.queue_depth.set(state.batcher.depth())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
