"""``python -m pipeline.tracking.preflight``: before any stage runs (``make run``, the flows), ask
the tracking server named by ``MLFLOW_TRACKING_URI`` one authenticated question. Wrong or missing
credentials, or a server that does not answer, is one clear error and exit 2, with nothing run and
nothing written; a stage would otherwise train for an hour and log nowhere. The embedded SQLite
store needs no check.

A tracking stage asks the same question at its start (``check_credentials``): only a refusal stops
it there (``CredentialsRefused``, a ``ParamsError``: one line, exit 2, under ``dvc repro`` as under
``make run``); a server that does not answer is the unsent queue's to wait for."""

from __future__ import annotations

import base64
import os
import sys
import urllib.error
import urllib.request

from pipeline.config.errors import ParamsError
from pipeline.tracking.store import safe_uri, tracking_uri


class PreflightError(RuntimeError):
    pass


class CredentialsRefused(ParamsError):
    """The tracking server answered 401 or 403: no retry mends that, so nothing is queued; the
    command stops with this one line (exit 2). A ``ParamsError``, so the stage runner says it so."""


def refused_message(uri: str, code: int) -> str:
    """The one line for a 401/403 from the server at ``uri``, naming the credentials to fix (never their value)."""
    given = "were refused" if _credential_headers() else "are missing"
    return (f"the MLflow server at {safe_uri(uri)} answered {code}: its credentials {given} "
            "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD; with the team's stack, `source .stack/env`)")


def _credential_headers() -> dict[str, str]:
    """The Authorization header MLflow's client sends for the environment's credentials (none without them)."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    if user is not None and password is not None:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


def _ask(uri: str, timeout_s: float) -> None:
    """One authenticated request (search one experiment); raises urllib's HTTPError or OSError."""
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers=_credential_headers())
    with urllib.request.urlopen(request, timeout=timeout_s):
        pass


def check_credentials(uri: str | None = None, timeout_s: float = 10.0) -> None:
    """At a tracking stage's start: ``CredentialsRefused`` when the server answers 401/403, before any
    work; any other answer, or none, is left to the stage (a server away: its record waits in the queue)."""
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    try:
        _ask(uri, timeout_s)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise CredentialsRefused(refused_message(uri, err.code)) from None
    except OSError:
        pass


def check_tracking_server(uri: str | None = None, timeout_s: float = 10.0) -> str:
    """A one-line description of the store when usable; PreflightError naming the fix otherwise."""
    uri = uri or tracking_uri()
    shown = safe_uri(uri)   # printed: never a password given inside the URL
    if not uri.startswith(("http://", "https://")):
        return f"MLflow store {uri} (embedded)"
    try:
        _ask(uri, timeout_s)
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise PreflightError(refused_message(uri, err.code)) from None
        raise PreflightError(f"the MLflow server at {shown} answered {err.code} {err.reason}") from None
    except OSError as err:
        raise PreflightError(f"the MLflow server at {shown} does not answer ({getattr(err, 'reason', err)}): start it "
                             "(make stack) or unset MLFLOW_TRACKING_URI for the embedded store") from None
    return f"MLflow server {shown} (as {os.environ.get('MLFLOW_TRACKING_USERNAME') or 'anonymous'})"


def require_tracking_server(uri: str | None = None) -> str:
    """``check_tracking_server`` for a command that cannot work without the store (serving, comparing):
    on a refusal or no answer, one ``error:`` line on stderr naming the server and its answer, and
    exit 2 (no traceback, no misleading "no version" further on)."""
    try:
        return check_tracking_server(uri)
    except PreflightError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def main() -> int:
    try:
        print(f"tracking: {check_tracking_server()}")
    except PreflightError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
