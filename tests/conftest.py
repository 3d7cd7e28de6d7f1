"""Shared pytest setup: every test starts from the same torch RNG state and thread count. ``make test``
runs two pytest-xdist workers with ``--dist loadfile``: a file's tests stay on one worker, so a module
fixture is built once and a session fixture (the pipeline workspace) at most once per worker."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    # One thread: the tests use tiny tensors, and on a shared 2-core machine two OpenMP threads
    # competing with another busy process made the suite ~30x slower (measured: 3.9 s against
    # 0.1 s for one cached-decoding test).
    torch.set_num_threads(1)
    yield

