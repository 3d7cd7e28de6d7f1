"""pipeline/tracking/failures.py: what MLflow's own client raises for each answer a tracking server
can give, sorted into refused (401/403: stop, queue nothing), away (no answer, 5xx, 429: wait) and
failed (another 4xx, anything else: set aside). The answers come from a real HTTP server on
127.0.0.1 speaking as MLflow's does (a JSON error body, or plain text as its auth layer answers 401);
the queue's location is asserted on real folders, DVC's temporary workspace included."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking import failures
from pipeline.tracking.preflight import CredentialsRefused, check_credentials
from pipeline.tracking.unsent import on_disk

from .test_offline_training import nowhere

pytestmark = pytest.mark.fast

ANSWERS = {   # path -> (status, content type, body)
    "/401": (401, "text/plain", "You are not authenticated. Please see the documentation."),
    "/403": (403, "application/json", json.dumps({"error_code": "PERMISSION_DENIED", "message": "no EDIT"})),
    "/404": (404, "application/json", json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no run"})),
    "/400": (400, "application/json", json.dumps({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad"})),
    "/500": (500, "application/json", json.dumps({"error_code": "INTERNAL_ERROR", "message": "db down"})),
    "/502": (502, "text/html", "<html>Bad Gateway</html>"),
    "/503": (503, "text/plain", "upstream unavailable"),
    "/429": (429, "text/plain", "slow down"),
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:   # noqa: N802 (http.server's name)
        status, kind, body = ANSWERS[self.path.split("/api/")[0]]
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def answering() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def raised(uri: str) -> Exception:
    """What MLflow's client raises asking ``uri`` for a run."""
    with pytest.raises(Exception) as caught:
        MlflowClient(uri, uri).get_run("0" * 32)
    return caught.value


@pytest.mark.parametrize(("answer", "kind", "status"), [
    ("401", failures.REFUSED, 401), ("403", failures.REFUSED, 403),
    ("400", failures.FAILED, 400), ("404", failures.FAILED, 404),
    ("500", failures.AWAY, 500), ("502", failures.AWAY, 502), ("503", failures.AWAY, 503),
    ("429", failures.AWAY, 429)])
def test_each_answer_of_the_server_is_sorted(answering, monkeypatch, answer, kind, status):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    err = raised(f"{answering}/{answer}")
    assert (failures.classify(err), failures.http_status(err)) == (kind, status), repr(err)


def test_no_answer_is_away_and_a_local_error_failed(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    err = raised(nowhere())
    assert failures.classify(err) == failures.AWAY and failures.http_status(err) is None
    assert failures.classify(FileNotFoundError("reports/mlflow_unsent/x/model.pt")) == failures.FAILED
    assert failures.classify(ValueError("edited by hand?")) == failures.FAILED
    assert failures.classify(TimeoutError()) == failures.AWAY


def test_a_refusal_is_one_line_naming_the_credentials_never_their_value(answering, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{answering}/401")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ada")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-value")
    message = str(failures.refusal(raised(f"{answering}/401")))
    assert message == (f"the MLflow server at {answering}/401 answered 401: its credentials were refused "
                       "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD; with the team's stack, "
                       "`source .stack/env`)")
    assert "s3cret" not in message and "\n" not in message
    with pytest.raises(CredentialsRefused, match="answered 401: its credentials were refused"):
        check_credentials()   # a stage's start
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{answering}/403")
    with pytest.raises(CredentialsRefused, match="answered 403: its credentials are missing"):
        check_credentials()
    # Away, or any other answer: the stage goes on (its record waits, or is set aside, at its end).
    for uri in (nowhere(), f"{answering}/500", f"{answering}/404"):
        check_credentials(uri)


def test_a_warning_call_still_stops_on_a_refusal(answering, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"{answering}/500")
    assert failures.best_effort("run end", MlflowClient(f"{answering}/500").get_run, "0" * 32) is None
    warning = capsys.readouterr().err
    assert warning.startswith("warning: MLflow run end failed: MlflowException: API request to "), warning
    with pytest.raises(CredentialsRefused):
        failures.best_effort("run end", MlflowClient(f"{answering}/403").get_run, "0" * 32)


def test_the_queue_lies_at_the_repository_root_from_any_of_its_folders(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "reports" / "deep").mkdir(parents=True)
    # DVC's temporary experiment workspace: a copy of the repository, .dvc included, inside .dvc/tmp/exps.
    temporary = repo / ".dvc" / "tmp" / "exps" / "tmpk2j4" / "sub"
    (temporary.parent / ".dvc").mkdir(parents=True)
    temporary.mkdir()
    for folder in (repo, repo / "reports" / "deep", temporary.parent, temporary):
        monkeypatch.chdir(folder)
        assert on_disk.repository_root() == repo.resolve()
        assert on_disk.queue_file() == repo.resolve() / "reports" / "mlflow_unsent.json"
    monkeypatch.chdir(temporary.parent)
    assert on_disk.shown(on_disk.queue_file()) == str(repo.resolve() / "reports" / "mlflow_unsent.json")
    monkeypatch.chdir(repo)
    assert on_disk.shown(on_disk.queue_file()) == "reports/mlflow_unsent.json"
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.chdir(outside)   # no repository: the working folder, as before
    assert on_disk.queue_file() == outside.resolve() / "reports" / "mlflow_unsent.json"
