"""What strangers send ``POST /invocations`` (pipeline/serving/server: ``requests`` and the app's
refusals): bodies that once answered 500 or 200 get one JSON 400; a request that can never fit the
queue gets 413 (no retry can help), a server shutting down 503, and 429 stays for a queue that
drains; a client gone before its body is read is counted (499) and logged in one line; middleware
added to the app applies to ``/invocations`` too, its fast path included.

The real app on uvicorn in this process (``test_server_health.serve``), real HTTP and raw sockets,
a tiny random model with its real tokenizer."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from . import test_export as exported
from . import test_server_health as health
from .test_server_health import Hanging, serve, state_of

pytestmark = pytest.mark.service

tokenizer_file, translator, running = exported.tokenizer_file, health.translator, health.running


def started(translator, running, **kwargs):   # noqa: ANN001, ANN003, ANN201
    fake = Hanging(translator)
    fake.release.set()   # decodes at once
    http, server, thread = serve(fake, **kwargs)
    running.append((fake, server, thread))
    return http


def post_bytes(http, body: bytes, **headers: str) -> tuple[int, dict, dict]:   # noqa: ANN001
    request = urllib.request.Request(http.url, body, {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


@pytest.mark.parametrize("body, code, message", [
    # JSON's escape of a lone surrogate: a str no tokenizer can read (was 500 from sentencepiece).
    (b'{"inputs": ["a \\ud800 b"]}', "INVALID_PARAMETER_VALUE",
     "text[0] is not valid Unicode: a lone surrogate (U+D800) at character 2"),
    (b'{"dataframe_records": [{"text": "ab"}, {"text": "\\udfff"}]}', "INVALID_PARAMETER_VALUE",
     "text[1] is not valid Unicode"),
    (b"[" * 2000 + b"]" * 2000, "MALFORMED_REQUEST", "nested deeper than the parser reads"),   # was RecursionError
    (b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}", "MALFORMED_REQUEST", "nested deeper"),
    (b'{"dataframe_records": "abc"}', "INVALID_PARAMETER_VALUE",   # was 200: one prediction a character
     "dataframe_records must be a list of records"),
    (b'{"dataframe_records": {"text": "ab"}}', "INVALID_PARAMETER_VALUE", "a list of records (JSON objects), e.g."),
    (b'{"dataframe_split": {"data": [["ab"]], "rows": 1}}', "INVALID_PARAMETER_VALUE",
     "dataframe_split must be an object with 'data'"),
    (b'{"dataframe_records": ["ab", "cd"]}', "INVALID_PARAMETER_VALUE", "got a list of str"),   # no records
    (b'{"inputs": [' + b"9" * 5000 + b"]}", "MALFORMED_REQUEST", "malformed JSON: a number of over 4300 digits"),
    (b'{"inputs": ["ab"], "params": {"beam_size": 1' + b"0" * 400 + b"}}", "INVALID_PARAMETER_VALUE",
     "params: beam_size must be an integer, got int 1000"),   # past float's range: was OverflowError, 500
    (b'{"inputs": ["ab"], "params": {"alpha": -1' + b"0" * 400 + b"}}", "INVALID_PARAMETER_VALUE",
     "params: alpha must be a number"),
    (b'{"inputs": ["ab"], "params": []}', "INVALID_PARAMETER_VALUE", "params must be a JSON object"),
])
def test_bodies_that_were_a_500_or_a_200_are_one_json_400(translator, running, body, code, message):
    http = started(translator, running)
    status, answer, headers = post_bytes(http, body)
    assert status == 400 and answer == {"error_code": code, "message": answer["message"]}, answer
    assert message in answer["message"] and headers["X-Model-Version"] == "1", answer
    status, answer, _ = http.post({"inputs": ["ab cd"]})   # and it keeps serving
    assert (status, answer["predictions"]) == (200, translator.translate(["ab cd"]))
    assert http.metrics()["translation_requests_total{status=400}"] == 1


def test_a_request_over_the_empty_queue_is_413_not_a_429_retried_forever(translator, running):
    http = started(translator, running, max_queue_sentences=2)
    status, answer, headers = http.post({"inputs": ["ab", "cd", "ef"]})
    assert status == 413 and answer["error_code"] == "REQUEST_LIMIT_EXCEEDED", answer
    assert answer["message"] == ("3 sentences in one request; this server queues at most 2 "
                                 "(--max-queue-sentences): split the request")
    assert "Retry-After" not in headers   # no retry can fit it
    status, answer, _ = http.post({"inputs": ["ab", "cd"]})   # as many as it holds: decoded
    assert (status, answer["predictions"]) == (200, translator.translate(["ab", "cd"]))


def test_a_server_shutting_down_answers_503_not_429(translator, running):
    fake = Hanging(translator)
    fake.release.set()
    state = state_of(fake)
    http, server, thread = serve(fake, state=state)
    running.append((fake, server, thread))
    state.batcher.stop(5.0)   # what the app's shutdown does once uvicorn has stopped accepting
    status, answer, headers = http.post({"inputs": ["ab"]})
    assert status == 503 and answer == {"error_code": "TEMPORARILY_UNAVAILABLE",
                                        "message": "the server is shutting down; not decoded"}, answer
    assert headers["X-Model-Version"] == "1"


def test_a_client_gone_before_its_body_is_read_is_counted_and_logged_once(translator, running, capfd):
    http = started(translator, running)
    port = int(http.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"inputs\": [\"ab")   # 15 of the 1000 bytes, then gone
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while http.metrics().get("translation_requests_total{status=499}") != 1:
        assert time.monotonic() < deadline, http.metrics()
        time.sleep(0.05)
    status, answer, _ = http.post({"inputs": ["ab cd"]})
    assert (status, answer["predictions"]) == (200, translator.translate(["ab cd"]))
    metrics = http.metrics()
    assert metrics["translation_batch_sentences_sum"] == 1   # the dropped one was not decoded
    assert metrics["translation_requests_total{status=499}"] == 1
    err = capfd.readouterr().err
    assert err.count("a client went away before its request's body was read; not decoded (499") == 1, err
    assert "Traceback" not in err and "Exception in ASGI application" not in err, err


class RefuseWithoutToken:
    """A pure ASGI middleware, as an authentication layer is: without the token, 401 and the app is
    never called; with it, each answer is stamped with the app it reached (``scope["app"]``, which
    Starlette sets and middleware may read as ``request.app``)."""

    def __init__(self, app) -> None:   # noqa: ANN001
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (b"authorization", b"Bearer t0ken") not in scope["headers"]:
            await JSONResponse({"error_code": "UNAUTHENTICATED", "message": "no token"}, 401)(scope, receive, send)
            return

        async def stamped(message: dict) -> None:
            if message["type"] == "http.response.start":
                app = type(scope["app"]).__name__.encode()
                message = {**message, "headers": [*message["headers"], (b"x-checked", b"yes"), (b"x-app", app)]}
            await send(message)

        await self.app(scope, receive, stamped)


def test_middleware_added_to_the_app_applies_to_invocations(translator, running):
    http = started(translator, running, middleware=(
        (CORSMiddleware, {"allow_origins": ["https://translate.example"], "allow_methods": ["POST"]}),
        (RefuseWithoutToken, {})))
    status, answer, _ = http.post({"inputs": ["ab cd"]})
    assert (status, answer) == (401, {"error_code": "UNAUTHENTICATED", "message": "no token"})
    status, answer, headers = post_bytes(http, b'{"inputs": ["ab cd"]}', Authorization="Bearer t0ken",
                                         Origin="https://translate.example")
    assert (status, answer["predictions"]) == (200, translator.translate(["ab cd"]))
    assert (headers["X-Checked"], headers["X-App"], headers["X-Model-Version"]) == ("yes", "FastAPI", "1")
    assert headers["Access-Control-Allow-Origin"] == "https://translate.example"
    assert http.get("/version")[0] == 401   # every route behind the same middleware
    counted = {k: v for k, v in http.metrics(Authorization="Bearer t0ken").items()
               if k.startswith("translation_requests_total")}
    assert counted == {"translation_requests_total{status=200}": 1.0}   # the refused one never reached the app
