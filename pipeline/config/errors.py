"""The errors configuration raises: light (no pydantic, no schema), so that the stage runner can
catch them without loading, and depending on, every section's code; and how a command reports a
user's error (one line, exit 2), for the stage runner and the configuration's own commands."""

from __future__ import annotations

import sys
from collections.abc import Callable


class ParamsError(ValueError):
    """A value in params.yaml is missing, unknown or invalid; the message is one line naming the key."""


class TuneReportMissing(ParamsError):
    """``evaluate`` leaves a decoding setting to the tune stage, which has not run yet (no report
    file). A caller may fall back to the paper's settings, saying so; a report that exists but holds
    no valid choice is a plain ``ParamsError``."""


def exit_2_on(errors: tuple[type[BaseException], ...], main: Callable[[], None]) -> None:
    """Run ``main``; one of ``errors`` (a user's mistake, not a bug) prints ``error: <its message>``
    on one line to stderr and exits 2, without a traceback. The package's field names read as
    params.yaml keys (``TrainConfig.max_tokens`` as ``train.max_tokens``)."""
    try:
        main()
    except errors as err:
        message = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())  # one line, always
        message = message.replace("TrainConfig.", "train.")
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
