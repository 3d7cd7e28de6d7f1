"""pipeline/serving/translator.py: the Translator decodes with oneDNN-packed weights (transformer/packed.py)
on a copy of the model, with the same outputs as the plain model."""

import pytest

from pipeline.config.decoding import DecodingConfig
from pipeline.serving.translator import Translator
from transformer.packed import PackedLinear

from ...transformer.conftest import tiny_model

pytestmark = pytest.mark.fast


def test_translator_packs_a_copy_of_the_model():
    model = tiny_model(seed=4)
    translator = Translator(model, tokenizer=None, decoding=DecodingConfig(beam_size=2))
    assert any(isinstance(m, PackedLinear) for m in translator.model.modules())
    assert not any(isinstance(m, PackedLinear) for m in model.modules())   # still trainable
    assert all(p.requires_grad for p in model.parameters())
    plain = Translator(model, tokenizer=None, decoding=DecodingConfig(beam_size=2), packed=False)
    assert plain.model is model
    ids = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    assert translator.translate_ids(ids) == plain.translate_ids(ids)
