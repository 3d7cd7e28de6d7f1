"""The text forms by name, and how a model's files record theirs: no text processing here, so that
what only names or stores a form (the params check, the train and average stages) does not depend on
the code that makes it (``pipeline.text.forms``, ``pipeline.text.moses``).

The tokenizer stage writes the form into ``data/tokens/stats.json``, the train stage into every
checkpoint (under ``callbacks``, ``CHECKPOINT_KEY``), the average stage into the averaged model: a model
file says the form it reads. ``raw`` is stored nowhere: a raw model's files are the bytes they always were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAW = "raw"
LC_NORM_TOK = "lc_norm_tok"
TEXT_FORMS = (RAW, LC_NORM_TOK)
CHECKPOINT_KEY = "text_form"   # in a model file and in data/tokens/stats.json, absent for raw


class TextFormError(ValueError):
    """A stored text form that this code does not know (a newer file, or a damaged one)."""


@dataclass(frozen=True)
class TextForm:
    """A text form and the languages it was made for (normalization and tokenization are per language)."""

    name: str = RAW
    src_lang: str = ""
    tgt_lang: str = ""

    def __post_init__(self) -> None:
        if self.name not in TEXT_FORMS:
            raise TextFormError(f"unknown text form {self.name!r}: expected one of {', '.join(TEXT_FORMS)}")
        if self.name != RAW and not (self.src_lang and self.tgt_lang):
            raise TextFormError(f"text form {self.name!r} needs its source and target languages")

    @property
    def is_raw(self) -> bool:
        return self.name == RAW

    @property
    def literature(self) -> bool:
        """Whether the model writes the Multi30k literature's form (scored as it is, ``bleu_lc_tok``)."""
        return self.name == LC_NORM_TOK

    def entry(self) -> dict[str, str] | None:
        """What a model file or stats file stores (None for raw: nothing is stored)."""
        if self.is_raw:
            return None
        return {"name": self.name, "src_lang": self.src_lang, "tgt_lang": self.tgt_lang}


def from_entry(entry: Any, source: str = "checkpoint") -> TextForm:
    """The form a stored ``entry`` names (None: raw). ``TextFormError`` naming ``source`` otherwise."""
    if entry is None:
        return TextForm()
    if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) for k in ("name", "src_lang",
                                                                                          "tgt_lang")):
        raise TextFormError(f"{source}: {CHECKPOINT_KEY} must be a mapping of name, src_lang and tgt_lang, "
                            f"got {str(entry)[:80]}")
    try:
        return TextForm(entry["name"], entry["src_lang"], entry["tgt_lang"])
    except TextFormError as err:
        raise TextFormError(f"{source}: {err}") from None


def text_form_of(stored: Mapping[str, Any], source: str = "checkpoint") -> TextForm:
    """The form a model file (or ``data/tokens/stats.json``) was made with: its own entry, or in a
    training checkpoint the one the train stage's callback stored (under ``callbacks``)."""
    entry = stored.get(CHECKPOINT_KEY)
    if entry is None and isinstance(stored.get("callbacks"), Mapping):
        entry = stored["callbacks"].get(CHECKPOINT_KEY)
    return from_entry(entry, source)
