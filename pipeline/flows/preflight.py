"""Before a command hands work to a Prefect server (``python -m pipeline.flows run|retrain|serve``
against ``PREFECT_API_URL``, ``python -m pipeline.workers deploy``), ask it one authenticated question
with the credentials Prefect's own client would send (``PREFECT_API_AUTH_STRING`` as basic auth, else
``PREFECT_API_KEY`` as a bearer token). Wrong or missing credentials, or a server that does not
answer, is one line naming the server and its answer instead of Prefect's traceback (and, for the
flows, before any stage runs). The MLflow side is ``pipeline.tracking.preflight``."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

from pipeline.tracking.store import safe_uri


class PrefectPreflightError(RuntimeError):
    pass


def _credentials() -> tuple[dict[str, str], str]:
    """The Authorization header Prefect's client sends, and the setting it comes from."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY

    auth_string, api_key = PREFECT_API_AUTH_STRING.value(), PREFECT_API_KEY.value()
    if auth_string:
        token = base64.b64encode(str(auth_string).encode()).decode()
        return {"Authorization": f"Basic {token}"}, "PREFECT_API_AUTH_STRING"
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}, "PREFECT_API_KEY"
    return {}, ""


def check_prefect_server(api_url: str, timeout_s: float = 10.0) -> str:
    """A one-line description of the server at ``api_url`` when it takes our credentials;
    PrefectPreflightError naming its answer and the fix otherwise."""
    shown = safe_uri(api_url)   # printed: never a password given inside the URL
    headers, source = _credentials()
    request = urllib.request.Request(f"{api_url.rstrip('/')}/hello", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            given = f"in {source} were refused" if headers else \
                "are missing (PREFECT_API_AUTH_STRING or PREFECT_API_KEY is not set)"
            raise PrefectPreflightError(f"the Prefect server at {shown} answered {err.code}: its credentials {given}; "
                                        "with the team's stack, `source .stack/env`") from None
        raise PrefectPreflightError(f"the Prefect server at {shown} answered {err.code} {err.reason}") from None
    except OSError as err:
        raise PrefectPreflightError(f"the Prefect server at {shown} does not answer "
                                    f"({getattr(err, 'reason', err)}): start it (make stack) or check "
                                    "PREFECT_API_URL") from None
    return f"Prefect server {shown}" + (f" (with {source})" if source else "")
