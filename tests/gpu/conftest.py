"""Strict float32 on the GPU for the comparisons of tests/gpu: TF32 matrix products (10-bit mantissa)
would make the explicit attention path differ from the fused one by ~1e-3 instead of ~1e-6."""

import os

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


# The GPU campaign (bench/gpu_campaign.sh) sets it on the GPU machine: there a skipped test is a failure.
REQUIRED_ENV = "GPU_TESTS_REQUIRED"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(REQUIRED_ENV) == "1":
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped where {REQUIRED_ENV}=1 (a GPU machine): {reason}"
