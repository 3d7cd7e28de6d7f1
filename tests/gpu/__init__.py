"""Tests that need a CUDA GPU: fused attention, decoding, fp16 loss scaling, resume and NCCL on the device.

Every test here is skipped where ``torch.cuda.is_available()`` is False (CI and the CPU machines);
run them on a GPU machine with ``GPU_TESTS_REQUIRED=1 python -m pytest -q tests/gpu``: with that variable
a skipped test counts as failed (``conftest.py``), as the GPU campaign (``bench/gpu_campaign.sh``) runs them.
"""

import pytest
import torch

requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: these tests check the GPU-only code paths (fused SDPA kernels, CUDA RNG, "
           "fp16 loss scaling, NCCL)")
