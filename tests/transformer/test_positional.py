"""transformer/positional.py: the sinusoids of §3.5 and learned positions."""

import math

import pytest
import torch

from transformer.positional import POSITIONAL, LearnedPositions, SinusoidalPositions, sinusoidal_encoding

pytestmark = pytest.mark.fast


def test_shape_and_dtype():
    pe = sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16) and pe.dtype == torch.float32
    assert float(pe.abs().max()) <= 1.0


def test_position_zero_is_sin0_cos0():
    pe = sinusoidal_encoding(10, 8)
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_positions_one_and_five_by_hand():
    d = 8
    pe = sinusoidal_encoding(10, d)
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), d = 8.
    assert pe[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-7)            # 0.841471
    assert pe[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-7)            # 0.540302
    assert pe[1, 2].item() == pytest.approx(math.sin(1 / 10000 ** (2 / 8)), abs=1e-7)  # sin(0.1)
    assert pe[1, 2].item() == pytest.approx(0.0998334, abs=1e-6)
    assert pe[1, 5].item() == pytest.approx(math.cos(1 / 10000 ** (4 / 8)), abs=1e-7)  # cos(0.01)
    assert pe[5, 0].item() == pytest.approx(math.sin(5.0), abs=1e-7)            # -0.958924
    assert pe[5, 0].item() == pytest.approx(-0.9589243, abs=1e-6)
    assert pe[5, 3].item() == pytest.approx(math.cos(5 / 10), abs=1e-7)         # cos(0.5) = 0.877583
    assert pe[5, 6].item() == pytest.approx(math.sin(5 / 10000 ** (6 / 8)), abs=1e-7)  # sin(0.005)
    assert pe[5, 7].item() == pytest.approx(math.cos(5 / 1000), abs=1e-7)


def test_every_entry_matches_the_formula():
    max_len, d = 64, 32
    pe = sinusoidal_encoding(max_len, d)
    for pos in (0, 3, 17, 63):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_odd_width_rejected():
    with pytest.raises(ValueError, match="even d_model"):
        sinusoidal_encoding(10, 7)


def test_sinusoidal_module_offsets_and_is_not_saved():
    module = SinusoidalPositions(20, 8)
    assert torch.equal(module(5, offset=3), sinusoidal_encoding(20, 8)[3:8])
    assert module(4).shape == (4, 8)
    assert "table" not in module.state_dict()
    with pytest.raises(ValueError, match=r"exceeds ModelConfig\.max_positions 20"):
        module(6, offset=15)


def test_learned_positions():
    module = LearnedPositions(20, 8)
    assert module(5, offset=2).shape == (5, 8)
    assert torch.equal(module(5, offset=2), module.embedding.weight[2:7])
    assert "embedding.weight" in module.state_dict()
    assert module(1).requires_grad
    with pytest.raises(ValueError, match=r"exceeds ModelConfig\.max_positions 20"):
        module(21)


@pytest.mark.parametrize("name", sorted(POSITIONAL))
def test_every_variant_builds_from_its_name_and_exposes_its_table(name):
    """The model builds POSITIONAL[name](max_positions, d_model); the export reads ``table``."""
    module = POSITIONAL[name](20, 8)
    assert module.table.shape == (20, 8)
    assert torch.equal(module(5, offset=3), module.table[3:8])
