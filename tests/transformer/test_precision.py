"""transformer/precision.py: device choice, precision checks, autocast."""

import contextlib
import warnings

import pytest
import torch

from transformer.precision import PRECISIONS, autocast, check_precision, cpu_supports_bf16, default_device

pytestmark = pytest.mark.fast


def test_default_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device() == torch.device(expected)


def test_check_precision():
    cpu = torch.device("cpu")
    assert PRECISIONS == ("auto", "fp32", "bf16", "fp16")
    assert check_precision("fp32", cpu) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # on CPUs without bf16 kernels: test_bf16_on_a_cpu_without_bf16_kernels_warns
        assert check_precision("bf16", cpu) is None
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        check_precision("fp16", cpu)
    with pytest.raises(ValueError, match="TrainConfig.precision must be one of"):
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


def test_bf16_on_a_cpu_without_bf16_kernels_warns():
    """Where oneDNN has bf16 kernels bf16 is accepted silently; elsewhere (AVX2 only) it still runs,
    15x slower than fp32 (measured), so the check says so. Each machine checks its own case."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_precision("bf16", torch.device("cpu"))
        check_precision("fp32", torch.device("cpu"))
    messages = [str(w.message) for w in caught]
    if cpu_supports_bf16():
        assert messages == []
    else:
        assert len(messages) == 1 and "bf16 matrix products run a slow fallback here, use fp32" in messages[0]


def test_auto_is_bf16_only_where_bf16_products_are_fast():
    from transformer.precision import cpu_supports_bf16, resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == ("bf16" if cpu_supports_bf16() else "fp32")
    assert [resolve_precision(p, cpu) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]
