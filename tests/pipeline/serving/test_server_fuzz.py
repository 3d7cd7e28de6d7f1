"""Fuzzing what strangers send ``POST /invocations`` (hypothesis): JSON of random shapes, nesting
and types around MLflow's four input forms and ``params``, random bytes, other encodings, bodies up
to the size limit and past it. Every answer is a 2xx with one prediction a sentence or one JSON
error with a code, never a 5xx; afterwards a valid request is answered exactly as the translator
answers it, and the server is ready.

Seeded (``derandomize``: the same examples every run) and bounded (``max_examples`` a test, 30 s a
request). The real app on uvicorn in this process (``test_server_health.serve``), real HTTP, a tiny
random model with its real tokenizer, bounds generous enough that nothing valid times out."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.serving.server.app import ServerSettings
from pipeline.serving.server.requests import FORMATS
from pipeline.serving.translator import Translator

from . import test_export as exported
from . import test_server_health as health
from .test_export import VOCAB
from .test_server import Server

pytestmark = pytest.mark.service

tokenizer_file = exported.tokenizer_file
LIMIT = ServerSettings("fuzz", "unused").max_body_bytes   # the served default, 1 MiB
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
SOURCES = ["ab cd", "ef gh ab", "hg fe dc ba", "a"]   # in the 24-piece tokenizer's alphabet

# Any JSON value; text of any code point, lone surrogates included (JSON's "\ud800" escape: hypothesis's
# text leaves them out, so they are put in).
ANY_TEXT = (st.text(st.characters(exclude_categories=["Co"]), max_size=40)
            | st.builds(lambda before, surrogate, after: before + chr(surrogate) + after, st.text("ab cd", max_size=8),
                        st.integers(0xD800, 0xDFFF), st.text("ab cd", max_size=8)))
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT
           | st.integers(min_value=10**18, max_value=10**40) | st.integers(min_value=-10**400, max_value=10**400))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
                    max_leaves=20)
TEXTS = st.sampled_from(SOURCES) | ANY_TEXT | st.text("abcdefgh ", max_size=1200)   # over MAX_CHARS too
SENTENCES = st.lists(TEXTS, max_size=6) | st.lists(st.sampled_from(SOURCES), min_size=250, max_size=270)
PARAM_NAMES = st.sampled_from(["beam_size", "alpha", "stopping", "max_len_b", "engine", "compute_type"]) | ANY_TEXT
PARAM_VALUES = (st.integers(-3, 20) | st.floats(-1, 12) | st.integers(10**300, 10**400)
                | st.sampled_from(["exact", "fairseq", "4", "0.6", "", "NaN"]) | JSON)
PARAMS = st.one_of(*[st.dictionaries(PARAM_NAMES, PARAM_VALUES, max_size=3)] * 3, JSON)   # mostly an object
RECORDS = st.lists(st.dictionaries(st.sampled_from(["text", "other"]), TEXTS | JSON, max_size=2), max_size=6)
SPLIT = st.fixed_dictionaries({"data": st.lists(st.lists(TEXTS | JSON, max_size=2), max_size=6) | JSON},
                              optional={"columns": st.just(["text"]) | JSON, "index": JSON, "rows": JSON})
INPUTS = SENTENCES | st.fixed_dictionaries({"text": SENTENCES}) | TEXTS
FORM_VALUES = {"dataframe_records": RECORDS | JSON, "dataframe_split": SPLIT | JSON, "inputs": INPUTS | JSON,
               "instances": INPUTS | JSON}
SHAPED = st.one_of(*[st.fixed_dictionaries({form: value}, optional={"params": PARAMS})
                     for form, value in FORM_VALUES.items()])
BODIES = (st.tuples(SHAPED, st.dictionaries(ANY_TEXT | st.sampled_from(FORMATS), JSON, max_size=2))
          .map(lambda pair: {**pair[1], **pair[0]}) | SHAPED | JSON)


@pytest.fixture(scope="module")
def translator(tokenizer_file) -> Translator:
    return health.tiny_translator(tokenizer_file)


@pytest.fixture(scope="module")
def served(translator) -> Iterator[Server]:
    """Bounds far above what a tiny model's decode takes, so a valid body is never a 503/504."""
    http, server, thread = health.serve(translator, deadline_seconds=30.0, stall_seconds=60.0)
    yield http
    server.should_exit = True
    thread.join(30)


def send(served: Server, body: bytes, content_type: str = "application/json") -> tuple[int, bytes]:
    host, port = served.base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/invocations", body=body, headers={"Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def answered_properly(status: int, raw: bytes) -> dict[str, Any]:
    """The answer, asserted to be a 200 with one string a prediction or one JSON 4xx error with a code."""
    assert status < 500, (status, raw[:500])
    answer = json.loads(raw)
    if status == 200:
        assert set(answer) == {"predictions"} and all(isinstance(p, str) for p in answer["predictions"]), answer
    else:
        assert 400 <= status < 500 and set(answer) == {"error_code", "message"}, (status, answer)
        assert isinstance(answer["error_code"], str) and answer["error_code"].isupper(), answer
        assert isinstance(answer["message"], str) and answer["message"], answer
    return answer


def serialized(body: Any, ensure_ascii: bool) -> bytes:
    """``body`` as JSON bytes; a lone surrogate left unescaped goes out as the invalid bytes it makes."""
    return json.dumps(body, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


def fuzzed(served: Server, translator, run: Callable[[], None]) -> None:   # noqa: ANN001
    """``run`` (a hypothesis test), then a valid request answered as the translator answers it and
    the server ready."""
    run()
    status, raw = send(served, json.dumps({"inputs": SOURCES, "params": {"beam_size": 2}}).encode())
    assert (status, json.loads(raw)["predictions"]) == (200, translator.translate(SOURCES, beam_size=2))
    assert served.get("/health/ready")[0] == 200
    assert not [k for k, v in served.metrics().items()
                if k.startswith("translation_requests_total{status=5") and v], served.metrics()


def test_json_of_random_shapes_around_the_four_forms_and_params(served, translator):
    @FUZZ
    @given(body=BODIES, ensure_ascii=st.booleans())
    def run(body: Any, ensure_ascii: bool) -> None:
        answer = answered_properly(*send(served, serialized(body, ensure_ascii)))
        if "predictions" in answer:   # a body the checks let through: one prediction a sentence
            assert isinstance(body, dict) and len(answer["predictions"]) >= 1

    fuzzed(served, translator, run)


def test_valid_bodies_in_every_form_are_translated_as_the_translator_does(served, translator):
    forms = {
        "dataframe_records": lambda texts: [{"text": t} for t in texts],
        "dataframe_split": lambda texts: {"columns": ["text"], "data": [[t] for t in texts]},
        "inputs": lambda texts: texts,
        "instances": lambda texts: texts,
    }

    @FUZZ
    @given(form=st.sampled_from(sorted(forms)), texts=st.lists(st.sampled_from(SOURCES), min_size=1, max_size=8),
           beam_size=st.none() | st.integers(1, VOCAB // 2), stopping=st.none() | st.sampled_from(["exact", "fairseq"]),
           encoding=st.sampled_from(["utf-8", "utf-16", "utf-32", "utf-8-sig"]), indent=st.none() | st.integers(0, 3))
    def run(form: str, texts: list[str], beam_size: int | None, stopping: str | None, encoding: str,
            indent: int | None) -> None:
        params = {k: v for k, v in {"beam_size": beam_size, "stopping": stopping}.items() if v is not None}
        body = json.dumps({form: forms[form](texts), "params": params}, indent=indent).encode(encoding)
        answer = answered_properly(*send(served, body))
        assert answer == {"predictions": translator.translate(texts, **params)}, (form, texts, params)

    fuzzed(served, translator, run)


def test_random_bytes_encodings_and_nesting(served, translator):
    nested = st.builds(lambda depth, opening, inner: opening * depth + inner + _closing(opening) * depth,
                       st.integers(1, 3000), st.sampled_from(["[", '{"a": ', '{"inputs": [']),
                       st.sampled_from(['"ab"', "", "1", '{"text": "ab"}']))
    text_bodies = (st.tuples(BODIES, st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252", "utf-8-sig"]))
                   .map(lambda pair: json.dumps(pair[0], ensure_ascii=False).encode(pair[1], "replace")))

    @FUZZ
    @given(body=st.one_of(st.binary(max_size=2000), text_bodies, nested.map(str.encode), nested.map(str.encode)),
           content_type=st.sampled_from(["application/json", "text/plain", "application/octet-stream", ""]))
    def run(body: bytes, content_type: str) -> None:
        answered_properly(*send(served, body, content_type))

    fuzzed(served, translator, run)


def _closing(opening: str) -> str:
    return {"[": "]", '{"a": ': "}", '{"inputs": [': "]}"}[opening]


def test_sizes_up_to_the_limit_and_past_it(served, translator):
    """A valid request padded with JSON whitespace to a drawn size: decoded up to the limit, 413 past
    it; one sentence, or many, filling the drawn size: decoded while the checks allow, 400 past them,
    413 past the limit."""
    core = json.dumps({"inputs": SOURCES[:2]}).encode()

    @settings(FUZZ, max_examples=40)
    @given(size=st.integers(len(core), LIMIT) | st.integers(LIMIT - 64, LIMIT + 64) | st.integers(LIMIT, 3 * LIMIT),
           shape=st.sampled_from(["padded", "one sentence", "many sentences"]))
    def run(size: int, shape: str) -> None:
        if shape == "padded":
            body = core[:-1] + b" " * (size - len(core)) + b"}"
        elif shape == "one sentence":
            body = b'{"inputs": ["' + b"ab " * ((size - 16) // 3) + b'"]}'
        else:
            body = b'{"inputs": [' + b",".join([b'"ab cd"'] * max(1, (size - 13) // 8)) + b"]}"
        status, raw = send(served, body)
        answer = answered_properly(status, raw)
        if len(body) > LIMIT:
            assert (status, answer["error_code"]) == (413, "REQUEST_LIMIT_EXCEEDED"), (len(body), answer)
        elif shape == "padded":
            assert answer == {"predictions": translator.translate(SOURCES[:2])}, len(body)
        elif status == 200:   # short enough for the model after all
            assert len(answer["predictions"]) == len(json.loads(body)["inputs"]), len(body)
        else:
            assert status == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE", (len(body), answer)

    fuzzed(served, translator, run)
