"""The errors the package raises for a caller to report, not to debug: a bad configuration value, an
unusable checkpoint, a batch that does not fit in memory, a loss that stopped being finite.

They live here, apart from the code that raises them, so that a caller catches them without loading
the model or the training code: the pipeline's stage runner catches all four around every stage,
the download and tokenizer stages included, and so depends on this file alone. Each is re-exported
where it is raised (``transformer.config``, ``transformer.checkpoint``, ``transformer.training.train_config``),
so existing imports keep working.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field as ``ModelConfig.<field>``.

    ``fields`` holds the offending field name(s), for callers that report them under their own
    names (the pipeline's params.yaml keys).
    """

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says why."""


class OutOfMemoryError(RuntimeError):
    """A batch did not fit in memory; the message names the batch's size and the knob to turn."""


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite and ``nan_policy`` is ``stop``."""
