"""Running a DVC stage: a user error (bad params, bad data, an unusable checkpoint) prints one
line and exits 2, without a traceback; the stage never outlives the process that started it.

Every stage runs this, the download and tokenizer stages included: it imports only light modules
(the errors it catches come from ``transformer.errors``, not from the model or training code that
raises them), so that no stage depends on code it does not run."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.config.errors import ParamsError, exit_2_on
from pipeline.data.spec import DataError
from transformer.errors import CheckpointError, NonFiniteLossError, OutOfMemoryError  # no model code

USER_ERRORS = (ParamsError, DataError, CheckpointError, OutOfMemoryError, NonFiniteLossError)


def run_stage(main: Callable[[], None]) -> None:
    """Run a stage's ``main``; a user error (bad params, bad data, unusable checkpoint) prints
    one line and exits 2, without a traceback (``exit_2_on``)."""
    from pipeline.stages.parent_death import signal_when_parent_dies

    signal_when_parent_dies()   # DVC gone (its flow run killed): SIGTERM, not an orphan stage
    exit_2_on(USER_ERRORS, main)
