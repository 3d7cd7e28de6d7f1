"""transformer/dropout.py: inverted dropout with 16-bit random lanes on CPU."""

import pytest
import torch

from transformer.dropout import Dropout, dropout

pytestmark = pytest.mark.fast


def test_identity_when_not_training_or_p_zero():
    x = torch.randn(5, 7)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    module = Dropout(0.3).eval()
    assert module(x) is x


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_and_scaling(p):
    n = 1_000_000
    x = torch.ones(n)
    y = dropout(x, p, training=True)
    kept = y != 0
    values = y.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p), rel=1e-6)
    # Kept fraction 1 - p within 6 standard deviations (sd = sqrt(p (1 - p) / n) < 0.0005).
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.003
    assert abs(float(y.mean()) - 1.0) < 0.006  # inverted dropout keeps the expectation
    # Neighbouring elements share a 64-bit word but are independent: P(both kept) = (1 - p)^2.
    both = (kept[0::2] & kept[1::2]).float().mean()
    assert abs(float(both) - (1 - p) ** 2) < 0.004


def test_odd_shapes_dtype_and_gradient():
    x = torch.randn(3, 5, 7, requires_grad=True)  # 105 elements: not a multiple of 4
    y = dropout(x, 0.25, training=True)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    mask = (y != 0).float()
    assert torch.allclose(x.grad, mask / 0.75)
    assert torch.allclose(y, x.detach() * mask / 0.75)
    half = dropout(torch.ones(9, dtype=torch.bfloat16), 0.5, training=True)
    assert half.dtype == torch.bfloat16


def test_reproducible_from_the_torch_seed():
    x = torch.ones(1000)
    torch.manual_seed(5)
    a = dropout(x, 0.3, training=True)
    b = dropout(x, 0.3, training=True)
    torch.manual_seed(5)
    c = dropout(x, 0.3, training=True)
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_module_validation():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)
    with pytest.raises(ValueError):
        Dropout(-0.1)
    assert repr(Dropout(0.1)) == "Dropout(p=0.1)"
    module = Dropout(0.5).train()
    assert float((module(torch.ones(10000)) == 0).float().mean()) == pytest.approx(0.5, abs=0.03)
