"""transformer/precision.py: device choice, precision checks, autocast."""

import contextlib

import pytest
import torch

from transformer.precision import PRECISIONS, autocast, check_precision, default_device


def test_default_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device() == torch.device(expected)


def test_check_precision():
    cpu = torch.device("cpu")
    assert PRECISIONS == ("fp32", "bf16", "fp16")
    assert check_precision("fp32", cpu) is None
    assert check_precision("bf16", cpu) is None
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        check_precision("fp16", cpu)
    with pytest.raises(ValueError, match="train.precision must be one of"):
        check_precision("fp64", cpu)


def test_autocast():
    cpu = torch.device("cpu")
    assert isinstance(autocast("fp32", cpu), contextlib.nullcontext)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast("fp32", cpu):
        assert torch.matmul(a, b).dtype == torch.float32
    with autocast("bf16", cpu):
        out = torch.matmul(a, b)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), a @ b, atol=0.1)
    assert a.dtype == torch.float32  # inputs and weights stay float32
