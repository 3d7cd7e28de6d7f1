"""The HTTP endpoints. ``/invocations`` (MLflow's format; every answer names the version in
``X-Model-Version``), ``/ping`` and ``/health`` (MLflow's), ``/health/live``, ``/health/ready``
(once a version is loaded and has translated a warm-up sentence; 503 with the reason while the
inference side cannot answer: a dead inference thread, or no batch finished for ``stall_seconds``
while requests wait), ``/version``, ``/metrics``.

Every refusal is one JSON error (``{"error_code": ..., "message": ...}``), a 4xx for what the client
sent: malformed JSON, JSON nested deeper than the parser goes, or a body the pyfunc model's checks
refuse, 400. A client that goes away before its body is read is counted as 499 (nginx's "client
closed request") and logged in one line.

Backpressure and bounds: a body over ``max_body_bytes`` is refused (413) before it is parsed, and so
is a request of more sentences than the queue holds when empty (``max_queue_sentences``: it could never
be queued, so no retry would help); a full queue answers 429 with ``Retry-After`` (it drains); a
server shutting down answers 503; a request still queued at its deadline (``deadline_seconds``)
is taken out of the queue and answered 503 undecoded; one whose batch has decoded for
``stall_seconds`` (past its deadline) is answered 504 while the batch goes on. So every request is
answered within ``deadline_seconds + stall_seconds``, whatever the decoder does.

The registry is polled every ``poll_seconds``: when ``champion`` moves (or, without one, a newer
version arrives), the new version is loaded and warmed beside the old, then swapped in one step;
requests already accepted finish on the version they were accepted on, and the old version is
released once none is left (drained). A version that fails to load leaves the old one serving and
says why in the log and in ``/version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from pipeline.serving.server.batcher import Batcher, DeadlineExceeded, Job, QueueFull, TooLarge, Unavailable
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
    stall_seconds: float = 60.0
    threads: tuple[int, int] | None = None   # CTranslate2's (inter_threads, intra_threads)
    engine: str | None = None                # forced engine (None: each version's own)


@dataclass
class ServerState:
    settings: ServerSettings
    current: ServedModel
    batcher: Batcher
    metrics: ServerMetrics
    swap_error: str = ""
    failed_versions: set[str] = field(default_factory=set)
    stop_watching: threading.Event = field(default_factory=threading.Event)
    helpers: list[threading.Thread] = field(default_factory=list)   # the registry's poll, the drains

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
            model = load_version(self.settings.tracking_uri, self.settings.name, version, why, run_id,
                                 threads=self.settings.threads, engine=self.settings.engine)
        except Exception as err:   # noqa: BLE001 - the old version keeps serving
            self.failed_versions.add(version)
            self.swap_error = f"version {version} failed to load: {type(err).__name__}: {str(err)[:300]}"
            self.metrics.swap_failures.inc()
            print(f"error: {self.swap_error}; still serving version {self.current.version}", file=sys.stderr,
                  flush=True)
            return
        old = self.current
        self.set_current(model)
        self.swap_error = ""
        self.metrics.swaps.inc()
        print(f"serving {self.settings.name} version {version} ({why}; run {run_id}) with {model.label}, was "
              f"{old.version}", flush=True)
        self.start_helper(self.drain, f"drain-{old.version}", old)

    def drain(self, old: ServedModel) -> None:
        """Release ``old`` once no request accepted on it is left (each is answered within its bound,
        so this ends); its memory is not held until the garbage collector finds it."""
        s = self.settings
        bound = time.monotonic() + s.deadline_seconds + s.stall_seconds + 5
        while old.requests or self.batcher.uses(old):
            if self.stop_watching.is_set():
                return   # shutting down: the process frees it
            if time.monotonic() > bound:
                print(f"warning: version {old.version} still has {old.requests} requests after its bound; not "
                      "released (a decode hangs?)", file=sys.stderr, flush=True)
                return
            time.sleep(0.05)
        old.release()
        print(f"version {old.version} drained and released", flush=True)

    def start_helper(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.helpers.append(thread)
        thread.start()

    def stop_helpers(self, timeout_s: float) -> None:
        """Stop polling and wait for a load or a release under way: a daemon thread still inside
        CTranslate2's or torch's C++ when the interpreter exits aborts the process (exit -6)."""
        self.stop_watching.set()
        end = time.monotonic() + timeout_s
        for thread in self.helpers:
            thread.join(max(0.0, end - time.monotonic()))
            if thread.is_alive():
                print(f"warning: {thread.name} still runs at exit", file=sys.stderr, flush=True)

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


class DirectInvocationsApp:
    """The ASGI app, sending ``POST /invocations`` directly to its handler: through Starlette's error middleware
    and the middleware added to the app (``add_middleware``: auth, CORS, ...), but not through
    FastAPI's router, its exception middleware and its route's request handling; everything else (and
    the lifespan) goes to the FastAPI app. Those layers took more of the event loop's time than our
    handling does: without them a one-sentence request costs the loop 0.74-0.79 ms of a core instead
    of 0.81-1.16 (docs/benchmarks.md), time every answer waits for at one client and the decoder loses
    under load. The route stays registered there, so the OpenAPI schema (``/docs``) still lists it.
    The stack is built at the first request, as Starlette builds its own: middleware is added before."""

    def __init__(self, app: FastAPI, invocations: Callable[[Request], Awaitable[Response]]) -> None:
        self.app, self.invocations = app, invocations
        self._invocations_stack: ASGIApp | None = None

    def add_middleware(self, middleware_class: Any, *args: Any, **kwargs: Any) -> None:
        """Add a middleware to the app, ``/invocations`` included (Starlette's ``add_middleware``)."""
        if self._invocations_stack is not None:
            raise RuntimeError("Cannot add middleware after an application has started")
        self.app.add_middleware(middleware_class, *args, **kwargs)

    async def _endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.invocations(Request(scope, receive))
        await response(scope, receive, send)

    def _stack(self) -> ASGIApp:
        """Starlette's stack (``Starlette.build_middleware_stack``) around ``_endpoint``: its error
        middleware with the app's handler for 500 (or Exception), then the user middleware; not
        FastAPI's own additions (its exception and exit-stack middleware)."""
        stack: ASGIApp = self._endpoint
        for middleware_class, args, kwargs in reversed(self.app.user_middleware):
            stack = middleware_class(stack, *args, **kwargs)
        handlers = self.app.exception_handlers
        return ServerErrorMiddleware(stack, handler=handlers.get(500) or handlers.get(Exception),
                                     debug=self.app.debug)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/invocations":
            if self._invocations_stack is None:
                self._invocations_stack = self._stack()
            scope["app"] = self.app   # as Starlette sets it: a middleware may read request.app
            await self._invocations_stack(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(state: ServerState) -> DirectInvocationsApp:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):   # noqa: ANN202
        state.batcher.start()
        state.start_helper(state.watch, "registry-poll")
        yield
        await asyncio.to_thread(state.stop_helpers, state.settings.drain_seconds)
        # uvicorn has stopped accepting and answered what was in flight; what is still queued is decoded.
        await asyncio.to_thread(state.batcher.stop, state.settings.drain_seconds)

    app = FastAPI(title="Transformer translation server", lifespan=lifespan)
    metrics = state.metrics

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        started = time.monotonic()
        model = state.current
        model.requests += 1   # on the event loop only: the drain of a swapped-out version reads it
        try:
            status, response = await _invocation(request, model)
        except ClientDisconnect:
            status, response = 499, Response(status_code=499)   # nobody to read it; counted, not decoded
            print(f"warning: a client went away before its request's body was read; not decoded (499; version "
                  f"{model.version})", file=sys.stderr, flush=True)
        except Exception as err:   # noqa: BLE001 - a bug of ours: one JSON 500, counted, its traceback once
            traceback.print_exc()
            status, response = 500, error(500, f"{type(err).__name__}: {str(err)[:300]}", "INTERNAL_ERROR",
                                          model.version)
        finally:
            model.requests -= 1
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
        except ValueError as err:   # JSONDecodeError, UnicodeDecodeError, or an integer of over 4300 digits
            why = err if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)) else "a number of over 4300 digits"
            return 400, error(400, f"malformed JSON: {why}", "MALFORMED_REQUEST", version)
        except RecursionError:
            return 400, error(400, "malformed JSON: nested deeper than the parser reads (a request is a few "
                              "levels deep)", "MALFORMED_REQUEST", version)
        try:
            if model.translator.tokenizer.preprocess is None:
                ids, decoding = checked(model.translator, parsed)
            else:   # the Moses scripts: ~0.4 ms a sentence, off the event loop (pipeline.text.forms)
                ids, decoding = await asyncio.to_thread(checked, model.translator, parsed)
        except BadRequest as err:
            return 400, error(400, err.message, err.error_code, version)
        except RecursionError:   # a body nested just under the parser's limit, deeper in pandas or repr
            return 400, error(400, "the body is nested too deeply for a request (a request is a few levels "
                              "deep)", "BAD_REQUEST", version)
        loop = asyncio.get_running_loop()
        settings = state.settings
        job = Job(ids, model, decoding, time.monotonic() + settings.deadline_seconds, loop.create_future(), loop)
        try:
            state.batcher.submit(job)
        except TooLarge as err:
            return 413, error(413, f"{err}: split the request", "REQUEST_LIMIT_EXCEEDED", version)
        except QueueFull as err:
            return 429, error(429, f"too many requests queued ({err}); retry shortly", "RESOURCE_EXHAUSTED",
                              version, **{"Retry-After": "1"})
        except Unavailable as err:
            return 503, error(503, f"{err}; not decoded", "TEMPORARILY_UNAVAILABLE", version)
        try:
            texts = await answer_of(job)
        except DeadlineExceeded as err:
            return 503, error(503, f"not started within {settings.deadline_seconds:g} s ({err}); not "
                              "decoded", "TEMPORARILY_UNAVAILABLE", version, **{"Retry-After": "1"})
        except TimeoutError:
            return 504, error(504, f"decoding did not finish within {settings.stall_seconds:g} s",
                              "DEADLINE_EXCEEDED", version)
        except Unavailable as err:
            return 503, error(503, str(err), "TEMPORARILY_UNAVAILABLE", version)
        except Exception as err:   # noqa: BLE001
            return 500, error(500, f"{type(err).__name__}: {err}", "INTERNAL_ERROR", version)
        return 200, JSONResponse({"predictions": texts}, headers={"X-Model-Version": version})

    async def answer_of(job: Job) -> list[str]:
        """The job's translations, within its bound whatever the decoder does: still queued at its
        deadline, it is withdrawn (``DeadlineExceeded``); started, it may decode for ``stall_seconds``
        from its start (``TimeoutError`` past that; the batch goes on, its answer is dropped)."""
        await asyncio.wait([job.future], timeout=max(0.0, job.deadline - time.monotonic()))
        if not job.future.done():
            if state.batcher.withdraw(job):
                raise DeadlineExceeded(f"queued for {time.monotonic() - job.queued_at:.2f} s")
            # Taken by a batch; started is set when its group begins (a moment later, at most).
            begun = job.started if job.started is not None else time.monotonic()
            await asyncio.wait([job.future], timeout=max(0.0, begun + state.settings.stall_seconds
                                                          - time.monotonic()))
            if not job.future.done():
                job.future.cancel()   # the batch's answer, if it ever comes, is dropped
                raise TimeoutError
        return job.future.result()

    @app.get("/ping")
    @app.get("/health")
    @app.get("/health/ready")
    async def ready() -> Response:
        problem = state.batcher.problem()
        if problem:
            return PlainTextResponse(f"not ready: {problem}\n", status_code=503,
                                     headers={"X-Model-Version": state.current.version})
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

    return DirectInvocationsApp(app, invocations)
