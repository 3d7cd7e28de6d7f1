"""Strict float32 on the GPU for the comparisons of tests/gpu: TF32 matrix products (10-bit mantissa)
would make the explicit attention path differ from the fused one by ~1e-3 instead of ~1e-6."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _no_tf32():
    if not torch.cuda.is_available():
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
