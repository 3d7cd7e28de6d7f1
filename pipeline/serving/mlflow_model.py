"""The translator as an MLflow pyfunc model: ``predict`` turns source sentences into translations.

Logged (``pipeline.pyfunc.log_version.log_translator``) with the averaged checkpoint (artifact
``model``), the SentencePiece model (``tokenizer``) and the export stage's CTranslate2 model of the
same weights (``ctranslate2``, a folder: ``artifacts/ctranslate2/`` in a downloaded version) as
artifacts and, as code, the modules of the ``transformer`` and ``pipeline`` packages that loading it
runs (their import closure, ``pipeline.pyfunc.model_code``: one upload each), so
``mlflow.pyfunc.load_model`` (and ``mlflow models serve``) needs nothing from this repository. The
model object itself is logged as code (``pipeline.pyfunc.mlflow_model_code``, MLflow's models from
code), never pickled; versions logged before that (a cloudpickled ``TranslatorModel``) still load.
The decoding settings the evaluate stage scored with, engine and compute type included, travel in
the model's ``model_config`` (and the request's ones as the defaults of the signature's params; both
written and read by ``pipeline.serving.registered``); a request may override the ones
``pipeline.serving.decoding.REQUEST`` names (beam size, alpha, stopping rule). The model decodes
with its engine (``pipeline.serving.engine``): versions registered before the engine was a setting,
which have no ``ctranslate2`` artifact, with torch, as they were scored; its pip requirements name
CTranslate2 where the engine is ctranslate2. A model of the literature's text form (``pipeline.text.forms``:
trained on lowercased, Moses-tokenized text, as its checkpoint says) prepares each sentence so and answers
with its output detokenized (still lowercase).

``predict`` checks its input before decoding anything, and a bad request is an
``MlflowException`` with ``INVALID_PARAMETER_VALUE`` (the scoring server answers 400 with the
message and keeps serving): an empty or non-string text, a text over ``MAX_CHARS`` characters
or over the model's source positions in pieces, a text that is not valid Unicode (a lone surrogate,
which JSON's ``\\ud800`` escape can send and no tokenizer can read), more than ``MAX_SENTENCES`` sentences in one
request, or params outside a request's limits (``pipeline.serving.decoding.request_settings``:
a beam size outside 1..16 or over half the model's vocabulary, an alpha outside 0..10, an unknown
stopping rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

if TYPE_CHECKING:
    from pipeline.config.decoding import DecodingConfig

CT2_ARTIFACT = "ctranslate2"   # the artifact (and its folder's name in the version) of the CTranslate2 model
MAX_CHARS = 1000        # characters per sentence: refused before tokenizing (Multi30k's longest is ~300)
MAX_SENTENCES = 256     # sentences per request: one request must not hold the server for minutes


def invalid(message: str) -> MlflowException:
    """A bad request: the scoring server answers 400 with ``message``."""
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def sentences_of(model_input: Any) -> list[str]:
    """The sentences of a request: a DataFrame with a ``text`` column (or one column), a list of
    str, or a str. Raises ``invalid`` for anything else and for a value that is not a string."""
    if isinstance(model_input, pd.DataFrame):
        if "text" in model_input.columns:
            values = model_input["text"].tolist()
        elif len(model_input.columns) == 1:
            values = model_input.iloc[:, 0].tolist()
        else:
            raise invalid(f"expected a 'text' column, got columns {list(model_input.columns)[:5]}")
    elif isinstance(model_input, pd.Series):
        values = model_input.tolist()
    elif isinstance(model_input, str):
        values = [model_input]
    elif isinstance(model_input, (list, tuple)):
        values = list(model_input)
    else:
        raise invalid(f"expected text: a 'text' column, a list of strings or a string, got {_describe(model_input)}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise invalid(f"text[{i}] is {_describe(value)}: every input must be a string (one sentence)")
    return values


class TranslatorModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of the version's engine's translator (beam search, §6.1): ours
    (``pipeline.serving.translator.Translator``) or CTranslate2's (``CT2Translator``)."""

    def load_context(self, context: Any) -> None:
        from pipeline.config.decoding import DecodingConfig
        from pipeline.serving.engine import load_engine_translator
        from pipeline.serving.registered import SettingsNotRecorded, registered_settings

        try:
            decoding = registered_settings(getattr(context, "model_config", None))
        except SettingsNotRecorded:
            # Logged before model_config carried the settings: MLflow's scoring server fills each
            # request's params with the signature's defaults; the rest are the paper's (§6.1).
            decoding = DecodingConfig()
        # No ctranslate2 artifact (a version from before the engine was a setting): torch, with a warning
        # only where its settings asked for ctranslate2.
        self.translator = load_engine_translator(context.artifacts["model"], context.artifacts["tokenizer"], decoding,
                                                 ct2_model=context.artifacts.get(CT2_ARTIFACT))

    def check(self, sentences: list[str]) -> list[list[int]]:
        """The pieces of each sentence; ``invalid`` for an empty or over-long one, or too many."""
        if not sentences:
            raise invalid("no text to translate: send at least one sentence")
        if len(sentences) > MAX_SENTENCES:
            raise invalid(f"{len(sentences)} sentences in one request; at most {MAX_SENTENCES}: split the request")
        for i, sentence in enumerate(sentences):
            if not sentence.strip():
                raise invalid(f"text[{i}] is empty: send a sentence to translate")
            if len(sentence) > MAX_CHARS:
                raise invalid(f"text[{i}] has {len(sentence)} characters; at most {MAX_CHARS} (one sentence per "
                              "input)")
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError as err:   # JSON's "\ud800" escape: no character, and no UTF-8 for it
                raise invalid(f"text[{i}] is not valid Unicode: a lone surrogate "
                              f"(U+{ord(sentence[err.start]):04X}) at character {err.start}") from None
        ids = self.translator.tokenizer.encode([s.strip() for s in sentences])
        limit = self.translator.max_source_tokens
        for i, pieces in enumerate(ids):
            if len(pieces) > limit:
                raise invalid(f"text[{i}] is {len(pieces)} pieces long; the model reads at most {limit} "
                              "(one sentence per input)")
        return ids

    def decoding(self, params: Mapping[str, Any] | None) -> DecodingConfig:
        """The settings this request decodes with: the model's own, and what its ``params`` set,
        checked against a request's limits (``invalid`` otherwise)."""
        from pipeline.serving.decoding import RequestError, request_settings

        try:
            settings = request_settings(self.translator.decoding, params)
        except RequestError as err:
            raise invalid(str(err)) from None
        most = self.translator.tokenizer.vocab_size // 2   # the search's 2K candidates must exist (§6.1)
        if settings.beam_size > most:
            raise invalid(f"params: beam_size must be at most {most} for this model (half its vocabulary), got "
                          f"{settings.beam_size}")
        return settings

    def predict(self, context: mlflow.pyfunc.PythonModelContext | None, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[str]:
        """model_input: a DataFrame with a ``text`` column (or one column), a list of str, or a str.
        Returns the translations, one str per input, in order. The hint says DataFrame, what MLflow's
        schema enforcement hands over: MLflow infers no schema from it (the signature is logged
        explicitly) and wraps nothing, where no hint would warn at import and ``list[str]`` would
        make MLflow convert the input itself. The translator is shared by the
        server's concurrent requests, so a request's settings are arguments, never its state."""
        ids = self.check(sentences_of(model_input))
        settings = self.decoding(params)
        tokenizer = self.translator.tokenizer   # a reader's text: detokenized where the model writes tokens
        return tokenizer.for_reader(tokenizer.decode(self.translator.translate_ids(ids, **settings.per_request())))
