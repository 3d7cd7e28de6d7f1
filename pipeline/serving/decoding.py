"""How a translator decodes (§6.1): beam size, length penalty, output length limit, batch and
precision. The one place these settings have defaults and are checked; ``pipeline.config.params``
checks the ``evaluate`` section through it, the translator and the MLflow model take it as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

PRECISIONS = ("fp32", "bf16")
# When beam search stops a sentence (``transformer.search.beam_search``): "exact", once no live
# hypothesis can beat the beam_size finished ones (the result of searching to the length limit);
# "fairseq", once beam_size hypotheses have finished (cheaper; can miss a longer, better one).
STOPPING = ("exact", "fairseq")


@dataclass(frozen=True)
class DecodingConfig:
    """The paper's defaults (§6.1: beam 4, length penalty alpha 0.6, output up to source length
    + 50). (``pipeline.config.params.Decoding`` is another thing: the beam size and alpha the evaluate
    stage chose, and where each came from.)"""

    beam_size: int = 4
    alpha: float = 0.6
    max_len_b: int = 50
    batch_sentences: int = 64
    precision: str = "fp32"
    stopping: str = "exact"

    def __post_init__(self) -> None:
        for name in ("beam_size", "max_len_b", "batch_sentences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DecodingConfig.{name} must be a positive integer, got {value!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha < 0:
            raise ValueError(f"DecodingConfig.alpha must be a number >= 0, got {self.alpha!r}")
        if self.stopping not in STOPPING:
            raise ValueError(f"DecodingConfig.stopping must be one of {', '.join(STOPPING)}, got {self.stopping!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"DecodingConfig.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def of(cls, settings: Any) -> DecodingConfig:
        """From a mapping or an object with these attributes (``params.evaluate``); other keys
        (``attention_sentences``) are ignored, missing or None ones keep the paper's defaults."""
        get = settings.get if isinstance(settings, Mapping) else lambda k: getattr(settings, k, None)
        return cls(**{f.name: get(f.name) for f in fields(cls) if get(f.name) is not None})

    def replace(self, **changes: Any) -> DecodingConfig:
        """A copy with ``changes`` (None values ignored), checked like a new one."""
        return DecodingConfig(**{**asdict(self), **{k: v for k, v in changes.items() if v is not None}})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
