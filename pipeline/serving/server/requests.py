"""MLflow's scoring-server request and error formats, so existing clients work unchanged:
``{"dataframe_records": [{"text": ...}]}``, ``{"dataframe_split": {"columns": [...], "data": [...]}}``,
``{"inputs": {"text": [...]}}`` / ``{"inputs": [...]}``, ``{"instances": [...]}``, each with an
optional ``"params": {"beam_size": 4, "alpha": 0.6, "stopping": "exact"}``; answers ``{"predictions": [...]}``, errors
``{"error_code": ..., "message": ...}``. The sentences are checked exactly as the registered pyfunc
model checks them (``pipeline.serving.mlflow_model``), with the same messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from mlflow.exceptions import MlflowException

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.engine import AnyTranslator
from pipeline.serving.mlflow_model import TranslatorModel, invalid, sentences_of
from transformer.tokenizer import Tokenizer

FORMATS = ("dataframe_records", "dataframe_split", "inputs", "instances")


class BadRequest(ValueError):
    def __init__(self, message: str, error_code: str = "INVALID_PARAMETER_VALUE") -> None:
        super().__init__(message)
        self.message, self.error_code = message, error_code


def model_input_of(body: Any) -> tuple[Any, dict[str, Any]]:
    """The model input and params of a parsed JSON body."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object with one of {', '.join(FORMATS)}", "BAD_REQUEST")
    keys = [k for k in FORMATS if k in body]
    if len(keys) != 1:
        raise BadRequest(f"the body must have exactly one of {', '.join(FORMATS)}; it has {sorted(body)[:6]}",
                         "BAD_REQUEST")
    params = body.get("params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise BadRequest("params must be a JSON object, e.g. {\"beam_size\": 4}")
    form, value = keys[0], body[keys[0]]
    if form == "dataframe_records" and (texts := _one_column_of_text(value)) is not None:
        return texts, params
    # MLflow's scoring server's own shape checks (``dataframe_from_parsed_json``): a string of
    # records would otherwise be read as one record a character.
    if form == "dataframe_records" and not (isinstance(value, list) and all(isinstance(r, dict) for r in value)):
        got = type(value).__name__ if not isinstance(value, list) else "a list of " + ", ".join(
            sorted({type(r).__name__ for r in value if not isinstance(r, dict)}))
        raise BadRequest(f"dataframe_records must be a list of records (JSON objects), e.g. [{{\"text\": ...}}], "
                         f"got {got}")
    if form == "dataframe_split" and not (isinstance(value, dict) and "data" in value
                                          and set(value) <= {"columns", "data", "index"}):
        raise BadRequest("dataframe_split must be an object with 'data' and optionally 'columns' and 'index', "
                         "e.g. {\"columns\": [\"text\"], \"data\": [[...]]}")
    try:
        if form == "dataframe_records":
            data: Any = pd.DataFrame(data=value)
        elif form == "dataframe_split":
            data = pd.DataFrame(value["data"], columns=value.get("columns"), index=value.get("index"))
        elif isinstance(value, dict):
            data = pd.DataFrame(value)
        else:
            data = value
    except Exception as err:   # noqa: BLE001 - whatever pandas makes of a stranger's table is a 400
        raise BadRequest(f"{form} is not a table: {type(err).__name__}: {str(err)[:200]}") from None
    return data, params


def _one_column_of_text(records: Any) -> list[str] | None:
    """The texts of records that all hold one and the same key with a string (``[{"text": ...}]``,
    MLflow's usual request), without a DataFrame: building one costs ~0.3 ms a request, as much
    as the rest of the request's handling together. None for anything else (pandas reads it, and
    its messages stay the pyfunc model's)."""
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and len(r) == 1 for r in records):
        return None
    (key,) = records[0]
    texts = [r.get(key) for r in records]
    return texts if all(isinstance(t, str) for t in texts) else None


class Pieces:
    """A tokenizer's ``encode`` and ``decode`` a sentence at a time: sentencepiece's list calls cost
    ~70 us each whatever the list's length (its batch path), one sentence ~3 us; a server's requests
    and batches hold a few sentences."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.sp, self.vocab_size, self.tokenizer = tokenizer.sp, tokenizer.vocab_size, tokenizer

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, in the form the model reads (the tokenizer's ``prepare``)."""
        return [self.sp.encode(text, out_type=int) for text in self.tokenizer.prepare(texts)]

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Each hypothesis as a reader gets it (the tokenizer's ``for_reader``)."""
        return self.tokenizer.for_reader([self.sp.decode(list(pieces)) for pieces in ids])


@dataclass
class OneByOne:
    """What the pyfunc model's checks read of a translator, tokenizing a sentence at a time."""

    translator: AnyTranslator

    def __post_init__(self) -> None:
        self.tokenizer = Pieces(self.translator.tokenizer)
        self.max_source_tokens = self.translator.max_source_tokens
        self.decoding = self.translator.decoding


def checked(translator: AnyTranslator, body: Any) -> tuple[list[list[int]], DecodingConfig]:
    """The pieces of each sentence and the decoding settings of a request (the version's, with what
    its params set); BadRequest (400) with the pyfunc model's own message for anything it would refuse."""
    data, params = model_input_of(body)
    checker = TranslatorModel()
    checker.translator = OneByOne(translator)
    try:
        ids = checker.check(sentences_of(data))
        decoding = checker.decoding(params)
    except MlflowException as err:
        raise BadRequest(err.message) from None
    return ids, decoding


__all__ = ["BadRequest", "checked", "invalid", "model_input_of"]
