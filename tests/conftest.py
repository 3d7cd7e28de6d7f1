"""Shared pytest setup: every test starts from the same torch RNG state and thread count; the test
tiers; and the order of the work among pytest-xdist workers.

Tiers (docs/testing.md). The markers of pyproject.toml name what makes a test expensive: ``service``
(a real server: PostgreSQL, MLflow, Prefect, the HTTP model server, the S3 store), ``pipeline``
(``dvc repro``, a DVC experiment, a stage or a bench as a subprocess), ``training`` (a real training
longer than a couple of seconds), ``slow`` (anything else past a few seconds); ``fast`` says a
module belongs to the quick tier. ``make test-fast`` deselects the four costly ones; ``make test``
(CI) runs everything. Every test module declares its tier in its ``pytestmark`` (a module without
one fails collection), and a test that costs more than its module carries its own mark; so a test
keeps its tier when it is renamed. Tests that use an expensive fixture (``FIXTURE_MARKS``) get its
marks here as well.

Workers. ``make test`` runs two pytest-xdist workers with ``--dist loadfile``: a file's tests stay on
one worker, so a module fixture is built once and a session fixture at most once per worker. On top
of that (``pytest_xdist_make_scheduler``), the modules that use one of the expensive session fixtures
of ``SHARED`` go to the same worker, so that fixture is built once per run and not once per worker
(the pipeline workspace is a whole ``dvc repro``). The units of work go out longest first, as their
tiers estimate (``TIER_SECONDS``): a long module handed out last runs alone at the end while the
other worker idles, and xdist's own order (most tests first) put the long service modules, which
have few tests, last.

Interrupts. A SIGTERM (a CI job's timeout, ``kill -- -PGID``) ends a worker's session as Ctrl-C does
(``pytest_configure``), so its fixtures still stop the servers they started, by their recorded PIDs;
without it a killed run left PostgreSQL, MLflow, Prefect and the S3 store running."""

from __future__ import annotations

import ast
import functools
import os
import signal
import threading
from collections import defaultdict
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent

# Fixtures that make a test expensive, and the marks they bring (to every test that uses them,
# directly or through another fixture).
FIXTURE_MARKS = {
    "stack": ("service",),                         # tests/team/conftest.py: the whole stack
    "prefect_api": ("service",),                   # test_flows: a Prefect server (prefect_test_harness)
    "workspace": ("pipeline",),                    # tests/pipeline/conftest.py: dvc repro of every stage
    "beam1_experiment": ("pipeline",),             # ... and dvc exp run on top of it
    "base_workspace": ("pipeline",),               # tests/reliability/conftest.py: three stages as a subprocess
    "copy_task": ("training",),                    # tests/transformer/conftest.py: 1000 updates of a copy task
}

TIERS = ("fast", "service", "pipeline", "training", "slow")

# The seconds a module is expected to take, from the most expensive tier among its tests: the order
# in which the xdist workers get the units of work (``longest_first``).
TIER_SECONDS = {"slow": 60.0, "training": 30.0, "pipeline": 30.0, "service": 30.0, "fast": 2.0}

# Session fixtures expensive enough that the modules using them share one worker.
SHARED = {"workspace": "workspace", "beam1_experiment": "workspace", "copy_task": "copy_task",
          "base_workspace": "base_workspace"}


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    # One thread: the tests use tiny tensors, and on a shared 2-core machine two OpenMP threads
    # competing with another busy process made the suite ~30x slower (measured: 3.9 s against
    # 0.1 s for one cached-decoding test).
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True, scope="module")
def _mlflow_uris_stay_in_their_module():
    """mlflow.set_tracking_uri and set_registry_uri (store.client() calls both) set process globals
    and export MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, which every later subprocess inherits: a
    module's store must not become the next module's (a sweep's winner was registered in a store an
    earlier module had left behind)."""
    import mlflow
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_env = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    saved = (tracking_utils._tracking_uri, registry_utils._registry_uri)
    yield
    mlflow.set_tracking_uri(saved[0])
    registry_utils._registry_uri = saved[1]
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM raises ``KeyboardInterrupt`` in a session that runs tests (an xdist worker, or a run
    without workers), whose teardown then runs the fixtures' finalizers. Not in an xdist controller:
    interrupted, it waits on workers already gone and hangs; left to SIGTERM's default it just ends."""
    controller = config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")
    if not controller and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def module_tiers(module: object) -> set[str]:
    """The tier markers of a test module's ``pytestmark``."""
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return {mark.name for mark in marks if getattr(mark, "name", None) in TIERS}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = sorted({item.nodeid.split("::", 1)[0] for item in items
                       if isinstance(item, pytest.Function) and not module_tiers(item.module)})
    if untiered:
        raise pytest.UsageError(
            f"test module(s) without a tier: {', '.join(untiered)}; give each a `pytestmark` of "
            f"{', '.join(f'pytest.mark.{t}' for t in TIERS)} (docs/testing.md); a test that costs more "
            "than its module's tier carries its own mark")
    for item in items:
        for name in sorted({m for f in getattr(item, "fixturenames", []) for m in FIXTURE_MARKS.get(f, ())}):
            item.add_marker(name)
    if hasattr(config, "workerinput"):   # an xdist worker: the scheduler hands out what it collected
        items[:] = longest_first(items)


def work_unit(path: str) -> str:
    """The scheduler's unit of work of the test module ``path``: its ``SHARED`` fixture, or itself."""
    shared = shared_fixture(path)
    return f"shared fixture {shared}" if shared else path


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items, units of work (``work_unit``) in the order of their expected seconds, longest
    first; the modules of a unit likewise, each module's tests in their own order. The scheduler
    hands the units out in that order. Every worker computes the same order (the same marks), as
    xdist requires."""
    modules: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        modules[item.nodeid.split("::", 1)[0]].append(item)

    expected = {path: max((TIER_SECONDS[m.name] for item in tests for m in item.iter_markers()
                           if m.name in TIER_SECONDS), default=TIER_SECONDS["fast"])
                for path, tests in modules.items()}
    units: dict[str, list[str]] = defaultdict(list)
    for path in sorted(modules, key=lambda path: -expected[path]):   # stable: ties keep the collection's order
        units[work_unit(path)].append(path)
    order = sorted(units.values(), key=lambda paths: -sum(expected[p] for p in paths))
    return [item for paths in order for path in paths for item in modules[path]]


@functools.cache
def shared_fixture(path: str) -> str | None:
    """The entry of ``SHARED`` that the test module ``path`` uses (a parameter of one of its functions)."""
    file = TESTS.parent / path
    if file.suffix != ".py" or not file.is_file():
        return None
    try:
        tree = ast.parse(file.read_bytes())
    except SyntaxError:
        return None
    names = {arg.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             for arg in node.args.args + node.args.kwonlyargs}
    found = sorted(SHARED[name] for name in names & SHARED.keys())
    return found[0] if found else None


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with the modules of one ``SHARED`` fixture as one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False   # the collection's order (longest_first) holds

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid.split("::", 1)[0])

    return SharedFixtureScheduling(config, log)
