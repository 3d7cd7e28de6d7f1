"""``python -m pipeline.tracking.preflight``: before any stage runs (``make run``, the flows), ask
the tracking server named by ``MLFLOW_TRACKING_URI`` one authenticated question. Wrong or missing
credentials, or a server that does not answer, is one clear error and exit 2, with nothing run and
nothing written; a stage would otherwise train for an hour and log nowhere. The embedded SQLite
store needs no check."""

from __future__ import annotations

import base64
import os
import sys
import urllib.error
import urllib.request

from pipeline.tracking.store import safe_uri, tracking_uri


class PreflightError(RuntimeError):
    pass


def check_tracking_server(uri: str | None = None, timeout_s: float = 10.0) -> str:
    """A one-line description of the store when usable; PreflightError naming the fix otherwise."""
    uri = uri or tracking_uri()
    shown = safe_uri(uri)   # printed: never a password given inside the URL
    if not uri.startswith(("http://", "https://")):
        return f"MLflow store {uri} (embedded)"
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    headers = {}
    if user is not None and password is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            given = "were refused" if headers else "are missing"
            raise PreflightError(f"the MLflow server at {shown} answered {err.code}: its credentials {given} "
                                 "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD; with the team's stack, "
                                 "`source .stack/env`)") from None
        raise PreflightError(f"the MLflow server at {shown} answered {err.code} {err.reason}") from None
    except OSError as err:
        raise PreflightError(f"the MLflow server at {shown} does not answer ({getattr(err, 'reason', err)}): start it "
                             "(make stack) or unset MLFLOW_TRACKING_URI for the embedded store") from None
    return f"MLflow server {shown} (as {user or 'anonymous'})"


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
