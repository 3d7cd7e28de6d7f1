"""pipeline/config/section.py: a pydantic ValidationError as one line naming the key's dotted path."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

from pipeline.config.average import AverageParams
from pipeline.config.data import DataParams
from pipeline.config.decoding import EvaluateParams, TuneParams
from pipeline.config.errors import ParamsError
from pipeline.config.flows import FlowsParams
from pipeline.config.section import bounds, dotted, package_message
from pipeline.config.tokenizer import TokenizerParams
from transformer.config import ConfigError, ModelConfig
from transformer.training.train_config import TrainConfig

pytestmark = pytest.mark.fast


def test_dotted_paths_write_list_positions_in_brackets():
    assert dotted("tune", ("alphas", 1)) == "tune.alphas[1]"
    assert dotted("train", ("max_tokens",)) == "train.max_tokens"
    assert dotted("data", ()) == "data"


@pytest.mark.parametrize("values, message", [
    ({"alphas": [0.6, "x"]}, "tune.alphas[1] must be a number, got 'x'"),
    ({"alphas": [0.6, -1]}, "tune.alphas[1] must be a number >= 0, got -1.0"),
    ({"beam_sizes": [4, True]}, "tune.beam_sizes[1] must be an integer, got True"),   # a bool is no int
    ({"stoppings": ["exact", "soon"]}, "tune.stoppings[1] must be one of exact, fairseq, got 'soon'"),
    ({"stoppings": "exact"}, "tune.stoppings must be a list, got 'exact'"),
    ({"max_sentences": 1.0}, "tune.max_sentences must be an integer, got 1.0"),
    ({"beam_size": [4]}, "unknown key tune.beam_size (known: engines, beam_sizes, alphas, stoppings, ct2_alphas, "
                         "max_sentences)"),
    ({"engines": ["torch", "onnx"]}, "tune.engines[1] must be one of torch, ctranslate2, got 'onnx'"),
    ({"engines": []}, "tune.engines must list at least one value"),
    ({"ct2_alphas": [1.0, 1.0]}, "tune.ct2_alphas lists a value twice: [1.0, 1.0]"),
])
def test_a_bad_value_is_one_line_naming_its_key(values, message):
    with pytest.raises(ParamsError) as err:
        TuneParams(**values)
    assert str(err.value) == message


@pytest.mark.parametrize("field, phrase", [
    (Annotated[int, Field(gt=0)], "must be positive"),
    (Annotated[int, Field(ge=0)], "must be >= 0"),
    (Annotated[int, Field(ge=16)], "must be at least 16"),
    (Annotated[float, Field(gt=0.5)], "must be greater than 0.5"),
    (Annotated[float, Field(gt=0, lt=1)], "must be in (0, 1)"),
    (Annotated[float, Field(ge=0.9, le=1)], "must be in [0.9, 1]"),
    (Annotated[float, Field(le=2)], "must be <= 2"),
    (Annotated[int, Field(ge=1_000_000)], "must be at least 1000000"),
])
def test_declared_bounds_read_as_params_yaml_words(field, phrase):
    assert bounds(field.__metadata__[0].metadata) == phrase


@pytest.mark.parametrize("section, values, message", [
    (AverageParams, {"last_n": 0}, "average.last_n must be positive, got 0"),
    (DataParams, {"max_ratio": 0.5}, "data.max_ratio must be at least 1, got 0.5"),
    (DataParams, {"limit_train_pairs": -1}, "data.limit_train_pairs must be >= 0, got -1"),
    (TokenizerParams, {"character_coverage": 1.5}, "tokenizer.character_coverage must be in [0.9, 1], got 1.5"),
    (TokenizerParams, {"input_sentence_size": 0}, "tokenizer.input_sentence_size must be positive, got 0"),
    (FlowsParams, {"significance": 1}, "flows.significance must be in (0, 1), got 1.0"),   # as the float it is
    (FlowsParams, {"retrain_mode": 5}, "flows.retrain_mode must be a string, got 5"),
    (FlowsParams, {"retrain_mode": "continue"}, "flows.retrain_mode must be one of scratch, finetune, got 'continue'"),
    (EvaluateParams, {"attention_sentences": -1}, "evaluate.attention_sentences must be >= 0, got -1"),
    (TokenizerParams, {"vocab_size": 16.0}, "tokenizer.vocab_size must be an integer, got 16.0"),   # type first
])
def test_a_declared_constraint_is_one_line_naming_its_key(section, values, message):
    with pytest.raises(ParamsError) as err:
        section(**values)
    assert str(err.value) == message


def test_an_unknown_key_is_named_before_other_problems():
    with pytest.raises(ParamsError, match="^unknown key tune.alpha "):
        TuneParams(alpha=1, max_sentences="x")


def test_ints_become_floats_nothing_else_is_coerced():
    tune = TuneParams(alphas=[0, 1.5])
    assert tune.alphas == [0.0, 1.5] and all(isinstance(a, float) for a in tune.alphas)
    with pytest.raises(ParamsError, match="flows.significance must be a number, got '0.05'"):
        FlowsParams(significance="0.05")


def test_a_check_across_keys_names_them_itself():
    with pytest.raises(ParamsError, match="^flows.bootstrap_resamples 10 is too few for significance 0.05"):
        FlowsParams(bootstrap_resamples=10)


def test_package_messages_name_params_keys():
    err = ConfigError("ModelConfig.d_model (256) must be divisible by ModelConfig.n_heads (7)", "d_model", "n_heads")
    assert package_message(err, ModelConfig, "model") == "model.d_model (256) must be divisible by model.n_heads (7)"
    err2 = ValueError("TrainConfig.max_tokens must be a positive integer,\n got -5")
    assert package_message(err2, TrainConfig, "train") == "train.max_tokens must be a positive integer, got -5"
