"""Shared pytest setup: every test starts from the same torch RNG state and thread count."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
