"""transformer/config.py: presets (Table 3) and validation that names the bad field."""

import dataclasses

import pytest

from transformer.config import PRESETS, ConfigError, ModelConfig, build_config

pytestmark = pytest.mark.fast


def test_base_and_big_presets_are_table_3():
    base = build_config("base", 37000)
    assert (base.d_model, base.n_heads, base.d_ff, base.n_encoder_layers, base.n_decoder_layers,
            base.dropout) == (512, 8, 2048, 6, 6, 0.1)
    assert base.d_head == 64
    big = build_config("big", 37000)
    assert (big.d_model, big.n_heads, big.d_ff, big.n_encoder_layers, big.n_decoder_layers,
            big.dropout) == (1024, 16, 4096, 6, 6, 0.3)
    assert big.d_head == 64
    # Paper defaults: post-LN, ReLU, sinusoids, shared embeddings.
    assert (base.norm_first, base.activation, base.positional, base.share_embeddings) == (
        False, "relu", "sinusoidal", True)


def test_tiny_preset_and_overrides():
    cfg = build_config("tiny", 24, dropout=0.2, n_heads=2)
    assert cfg.vocab_size == 24
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout) == (32, 2, 64, 0.2)
    assert cfg.d_head == 16
    assert set(PRESETS) == {"tiny", "small", "laptop", "base", "big"}


def test_to_dict_from_dict_round_trip():
    cfg = build_config("small", 100, activation="gelu", norm_first=True)
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.to_dict()["activation"] == "gelu"


def test_config_is_frozen():
    cfg = build_config("tiny", 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 64


def test_d_model_not_divisible_by_heads():
    with pytest.raises(ConfigError, match=r"ModelConfig\.d_model \(30\).*ModelConfig\.n_heads \(4\)"):
        build_config("tiny", 10, d_model=30)


@pytest.mark.parametrize("name", ["dropout", "attention_dropout", "activation_dropout"])
@pytest.mark.parametrize("value", [1.0, -0.1, 1.5, "0.1", True])
def test_dropout_outside_unit_interval(name, value):
    with pytest.raises(ConfigError, match=rf"ModelConfig\.{name} must be a number in \[0, 1\)"):
        build_config("tiny", 10, **{name: value})


def test_dropout_edges_accepted():
    assert build_config("tiny", 10, dropout=0.0).dropout == 0.0
    assert build_config("tiny", 10, dropout=0.999).dropout == 0.999


def test_unknown_preset():
    with pytest.raises(ConfigError, match=r"preset 'huge' does not exist"):
        build_config("huge", 10)


def test_bad_activation():
    with pytest.raises(ConfigError, match=r"ModelConfig\.activation must be one of \('relu', 'gelu'\), got 'tanh'"):
        build_config("tiny", 10, activation="tanh")


def test_bad_positional():
    with pytest.raises(ConfigError, match=r"ModelConfig\.positional must be one of \('sinusoidal', 'learned'\)"):
        build_config("tiny", 10, positional="rotary")


@pytest.mark.parametrize("name,value", [("vocab_size", 0), ("d_model", -32), ("n_heads", 0),
                                        ("d_ff", 2.5), ("n_encoder_layers", True), ("max_positions", 0)])
def test_positive_integers(name, value):
    overrides = {} if name == "vocab_size" else {name: value}
    vocab = value if name == "vocab_size" else 10
    with pytest.raises(ConfigError, match=rf"ModelConfig\.{name} must be a positive integer"):
        build_config("tiny", vocab, **overrides)


def test_bool_fields_and_pad_id():
    with pytest.raises(ConfigError, match=r"ModelConfig\.norm_first must be True or False"):
        build_config("tiny", 10, norm_first="yes")
    with pytest.raises(ConfigError, match=r"ModelConfig\.pad_id must be in \[0, ModelConfig\.vocab_size = 10\)"):
        build_config("tiny", 10, pad_id=10)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown ModelConfig field.*n_layers"):
        build_config("tiny", 10, n_layers=3)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("overrides, fields", [({"d_model": 30}, ("d_model", "n_heads")),
                                               ({"dropout": 2.0}, ("dropout",)),
                                               ({"n_layers": 3, "depth": 1}, ("depth", "n_layers"))])
def test_config_error_names_its_fields(overrides, fields):
    """The fields travel with the error, for callers that name them their own way (params.yaml)."""
    with pytest.raises(ConfigError) as caught:
        build_config("tiny", 10, **overrides)
    assert caught.value.fields == fields


def test_every_message_names_the_package_s_fields_not_params_yaml_keys():
    bad = [dict(d_model=30), dict(dropout=2.0), dict(activation="tanh"), dict(positional="rotary"), dict(n_heads=0),
           dict(norm_first=1), dict(pad_id=10), dict(n_layers=3)]
    for overrides in bad:
        with pytest.raises(ConfigError) as caught:
            build_config("tiny", 10, **overrides)
        assert "model." not in str(caught.value)


def test_variant_names_come_from_the_tables():
    """Validation accepts exactly the names of layers.ACTIVATIONS and positional.POSITIONAL, which
    config.py holds as plain data (it imports no layer code)."""
    from transformer.config import ACTIVATION_NAMES, POSITIONAL_NAMES
    from transformer.layers import ACTIVATIONS
    from transformer.positional import POSITIONAL

    assert set(ACTIVATIONS) == {"relu", "gelu"} and set(POSITIONAL) == {"sinusoidal", "learned"}
    assert tuple(ACTIVATIONS) == ACTIVATION_NAMES and tuple(POSITIONAL) == POSITIONAL_NAMES
    for name in ACTIVATIONS:
        assert build_config("tiny", 10, activation=name).activation == name
    for name in POSITIONAL:
        assert build_config("tiny", 10, positional=name).positional == name
