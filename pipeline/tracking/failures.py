"""What a failed tracking call means for what was to be sent, from the exception MLflow's client
raised (its REST client, its artifact uploads, or ``requests`` underneath):

- ``REFUSED``: the server answered 401 or 403. No retry mends wrong credentials or a missing
  permission, so nothing is queued for it: the command stops (``CredentialsRefused``, exit 2).
- ``AWAY``: no answer (connection refused or reset, a timeout) or a 5xx/429 (the server or its
  database unwell): the record waits in the unsent queue, in order, and is sent when it answers.
- ``FAILED``: anything else (another 4xx, a file gone or edited, a bug): sending again will not
  help until someone looks, so the record is set aside (``unsent.deferred``) and the others go on.

``best_effort`` runs a tracking call whose failure is a warning, never the end of a stage's work,
except a refusal.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

from pipeline.tracking.preflight import CredentialsRefused, refused_message
from pipeline.tracking.store import tracking_uri

REFUSED, AWAY, FAILED = "refused", "away", "failed"
_RETRIES_SPENT = re.compile(r"too many (\d{3}) error responses")
_REFUSALS = (401, 403)


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def http_status(err: BaseException) -> int | None:
    """The HTTP status the server answered, when the exception (or one it came from) carries one;
    None for a request that got no answer."""
    import requests
    from mlflow.exceptions import MlflowException, RestException

    for e in _chain(err):
        if isinstance(e, requests.HTTPError) and e.response is not None:
            return int(e.response.status_code)
        if isinstance(e, RestException):   # the server's JSON error body: its code maps to the status
            return int(e.get_http_status_code())
        if isinstance(e, MlflowException) and " failed with error code " in str(e):   # a non-JSON body
            return int(e.get_http_status_code())
        retried = _RETRIES_SPENT.search(str(e))   # a retried status (5xx, 429): urllib3's ResponseError
        if retried:
            return int(retried.group(1))
    return None


def _no_answer(err: BaseException) -> bool:
    import requests
    from mlflow.exceptions import MlflowException

    for e in _chain(err):
        if isinstance(e, (requests.ConnectionError, requests.Timeout, TimeoutError, ConnectionError)):
            return True
        # MLflow's REST client wraps a request that got no answer (retries spent) in a plain message.
        if isinstance(e, MlflowException) and str(e).startswith("API request to ") and (
                " failed with exception " in str(e) or " failed with timeout exception " in str(e)):
            return True
    return False


def classify(err: BaseException) -> str:
    """``REFUSED``, ``AWAY`` or ``FAILED`` (this module's docstring)."""
    if isinstance(err, CredentialsRefused):
        return REFUSED
    status = http_status(err)
    if status in _REFUSALS:
        return REFUSED
    if status is not None:
        return AWAY if status >= 500 or status == 429 else FAILED
    return AWAY if _no_answer(err) else FAILED


def refusal(err: BaseException) -> CredentialsRefused:
    """The one-line error for a refused call (``classify(err) == REFUSED``)."""
    if isinstance(err, CredentialsRefused):
        return err
    return CredentialsRefused(refused_message(tracking_uri(), http_status(err) or 401))


def reason(err: BaseException) -> str:
    """The failure in a few words, for the queue's file and the warning lines."""
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def best_effort(action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a tracking call; a failure is a warning, never the end of the stage's work, except the
    server refusing the credentials (401/403): ``CredentialsRefused``, which no retry would mend."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        if classify(err) == REFUSED:
            raise refusal(err) from None
        print(f"warning: MLflow {action} failed: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr, flush=True)
        return None
