"""pipeline/config/decoding.py: every decoding setting's default, limits and checks in one place,
and who sets it (the tune stage on the validation set, a request)."""

from __future__ import annotations

import math

import pytest

from pipeline.config import decoding as settings
from pipeline.config.decoding import DecodingConfig
from transformer.search import STOPPING_RULES

pytestmark = pytest.mark.fast


def test_the_papers_defaults_and_who_sets_what():
    assert DecodingConfig().to_dict() == {"beam_size": 4, "alpha": 0.6, "max_len_b": 50, "batch_sentences": 64,
                                          "precision": "fp32", "stopping": "exact", "engine": "torch",
                                          "compute_type": "float32"}   # §6.1, decoded by our search
    assert set(settings.RULES) == set(DecodingConfig().to_dict())
    assert settings.REQUEST == ("beam_size", "alpha", "stopping")
    assert settings.TUNED == ("beam_size", "alpha", "stopping", "engine", "compute_type")   # chosen on val
    # versions registered before the rule, the engine existed
    assert settings.LEGACY == {"stopping": "exact", "engine": "torch"}
    assert settings.ENGINES == ("torch", "ctranslate2") and settings.COMPUTE_TYPES == ("int8", "float32")
    assert set(settings.STOPPING) <= set(STOPPING_RULES)   # rules the search has
    assert settings.PRECISIONS == ("fp32", "bf16")
    assert (settings.MAX_BEAM, settings.ALPHA_RANGE) == (16, (0.0, 10.0))


@pytest.mark.parametrize("changes, message", [
    ({"beam_size": 0}, "DecodingConfig.beam_size must be a positive integer, got 0"),
    ({"beam_size": True}, "DecodingConfig.beam_size must be a positive integer, got True"),
    ({"max_len_b": 2.5}, "DecodingConfig.max_len_b must be a positive integer, got 2.5"),
    ({"alpha": -0.1}, "DecodingConfig.alpha must be a number >= 0, got -0.1"),
    ({"alpha": math.nan}, "DecodingConfig.alpha must be a number >= 0, got nan"),
    ({"stopping": "early"}, "DecodingConfig.stopping must be one of exact, fairseq, got 'early'"),
    ({"precision": "fp16"}, "DecodingConfig.precision must be one of fp32, bf16, got 'fp16'"),
    ({"engine": "onnx"}, "DecodingConfig.engine must be one of torch, ctranslate2, got 'onnx'"),
    ({"compute_type": "fp16"}, "DecodingConfig.compute_type must be one of int8, float32, got 'fp16'"),
    ({"engine": "ctranslate2"}, "DecodingConfig.stopping exact is our search's rule: CTranslate2 stops once "
                                "beam_size hypotheses have finished; use stopping fairseq with engine ctranslate2"),
])
def test_a_bad_setting_names_its_field(changes, message):
    with pytest.raises(ValueError, match=f"^{message.replace('(', '.').replace(')', '.')}$"):
        DecodingConfig(**changes)
    with pytest.raises(ValueError, match="^DecodingConfig."):
        DecodingConfig().replace(**changes)


def test_of_replace_and_per_request():
    # CTranslate2's default stopping rule is its own (the paper's default, exact, is our search's)
    assert DecodingConfig.of({"engine": "ctranslate2"}).stopping == "fairseq"
    assert DecodingConfig.of({"engine": "ctranslate2", "stopping": "fairseq"}) == DecodingConfig.of(
        {"engine": "ctranslate2", "stopping": None})
    config = DecodingConfig.of({"beam_size": 5, "alpha": None, "attention_sentences": 3})
    assert (config.beam_size, config.alpha) == (5, 0.6)       # None and unknown keys: ignored
    changed = config.replace(alpha=1.5, stopping=None)
    assert (changed.alpha, changed.stopping, config.alpha) == (1.5, "exact", 0.6)
    assert changed.per_request() == {"beam_size": 5, "alpha": 1.5, "stopping": "exact"}
    assert hash(changed) == hash(DecodingConfig(beam_size=5, alpha=1.5))   # the server groups requests by it
