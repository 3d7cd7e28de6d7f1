"""Shared pytest setup: every test starts from the same torch RNG state and thread count; under
pytest-xdist (``make test`` runs two workers), each test file stays on one worker."""

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


# A session fixture is built once per worker that uses it: the tests using one of these (the whole
# `dvc repro` of tests/pipeline/conftest.py, the stages of tests/reliability/conftest.py, the trained
# copy task) form one group. Every other file is its own group: its module fixtures are built once.
SHARED_FIXTURES = ("workspace", "base_workspace", "copy_task")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        shared = next((name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())), None)
        item.add_marker(pytest.mark.xdist_group(shared or item.nodeid.split("::", 1)[0]))
