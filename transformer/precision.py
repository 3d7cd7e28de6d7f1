"""Device and numeric precision choices for training and inference."""

from __future__ import annotations

import contextlib
import warnings

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_supports_bf16() -> bool:
    """True where oneDNN has fast bf16 kernels (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 where the device has fast bf16 products (a GPU that supports it, a CPU with
    oneDNN bf16 kernels), else fp32. Other values are returned as they are."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_supports_bf16() else "fp32"


def check_precision(precision: str, device: torch.device) -> None:
    """Raise ``ValueError`` for a precision this device cannot run, before any work."""
    if precision not in PRECISIONS:
        raise ValueError(f"TrainConfig.precision must be one of {PRECISIONS}, got {precision!r}")
    if device.type == "cpu" and precision == "fp16":
        raise ValueError("TrainConfig.precision fp16 needs a GPU; on CPU use bf16 or fp32")
    if device.type == "cpu" and precision == "bf16" and not cpu_supports_bf16():
        # Measured on an AVX2-only AMD EPYC: a 4096x256x1024 bf16 product at ~5 GFLOP/s against
        # ~40 in fp32, and a training step of the small preset 15x slower than in fp32.
        warnings.warn("TrainConfig.precision bf16 on a CPU without oneDNN bf16 kernels (AVX512 or AMX): "
                      "bf16 matrix products run a slow fallback here, use fp32", stacklevel=2)
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("TrainConfig.precision bf16 is not supported by this GPU; use fp16 or fp32")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass: weights and optimiser stay in float32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)
