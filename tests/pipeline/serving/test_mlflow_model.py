"""pipeline/serving/mlflow_model: the pyfunc model's checks, which our server shares, refuse what
strangers send with ``INVALID_PARAMETER_VALUE`` (a 400 in either server) before decoding anything.
A tiny random model with its real tokenizer, the real ``predict``. (A DataFrame cannot hold a lone
surrogate: pandas' arrow strings refuse it, and our server answers that 400 as "not a table".)"""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.mlflow_model import TranslatorModel

from . import test_export as exported
from .test_export import VOCAB
from .test_server_health import tiny_translator

pytestmark = pytest.mark.fast

tokenizer_file = exported.tokenizer_file


@pytest.fixture
def model(tokenizer_file) -> TranslatorModel:
    model = TranslatorModel()
    model.translator = tiny_translator(tokenizer_file, DecodingConfig(beam_size=2, max_len_b=4))
    return model


@pytest.mark.parametrize("model_input, params, message", [
    (["ab \ud800 cd"], None, "text[0] is not valid Unicode: a lone surrogate (U+D800) at character 3"),
    ("\udfffcd", None, "text[0] is not valid Unicode: a lone surrogate (U+DFFF) at character 0"),
    (["ab"], {"beam_size": VOCAB // 2 + 1}, f"params: beam_size must be at most {VOCAB // 2} for this model (half "
                                            f"its vocabulary), got {VOCAB // 2 + 1}"),
], ids=["surrogate-in-a-list", "surrogate-in-a-string", "beam-over-half-the-vocabulary"])
def test_what_no_decoder_can_take_is_refused_before_decoding(model, model_input, params, message):
    with pytest.raises(MlflowException) as refused:
        model.predict(None, model_input, params)
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE" and refused.value.message == message


def test_the_largest_beam_the_vocabulary_allows_decodes(model):
    assert model.predict(None, ["ab cd"], {"beam_size": VOCAB // 2}) == \
        model.translator.translate(["ab cd"], beam_size=VOCAB // 2)
