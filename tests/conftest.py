"""Shared pytest setup: every test starts from the same torch RNG state and thread count; the test
tiers; and the order of the work among pytest-xdist workers.

Tiers (docs/testing.md). The markers of pyproject.toml name what makes a test expensive: ``service``
(a real server: PostgreSQL, MLflow, Prefect, the HTTP model server, the S3 store), ``pipeline``
(``dvc repro``, a DVC experiment, a stage or a bench as a subprocess), ``training`` (a real training
longer than a couple of seconds), ``slow`` (anything else past a few seconds). ``make test-fast``
deselects all four; ``make test`` (CI) runs everything. They are added here, in one place, by what a
test uses (its directory, its fixtures) and, for the rest, by the table ``MARKS``; a test module may
also carry its own ``pytestmark``.

Workers. ``make test`` runs two pytest-xdist workers with ``--dist loadfile``: a file's tests stay on
one worker, so a module fixture is built once and a session fixture at most once per worker. On top
of that (``pytest_xdist_make_scheduler``), the modules that use one of the expensive session fixtures
of ``SHARED`` go to the same worker, so that fixture is built once per run and not once per worker
(the pipeline workspace is a whole ``dvc repro``)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent

# Directories whose every test has the marks: tests/team starts the team's services (the stack, or
# second hosts in network namespaces running torchrun and Prefect workers).
DIRECTORY_MARKS = {"team": ("service",)}

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

# The rest, by module or by test (a node id prefix), from `--durations` of the whole suite.
MARKS = {
    "tests/pipeline/serving/test_server.py": ("service", "training"),   # the HTTP model server, a registered model
    "tests/pipeline/serving/test_mlflow_server.py": ("service", "training"),   # mlflow models serve
    "tests/pipeline/test_tracking.py::test_training_survives_a_tracking_server": ("service", "pipeline"),
    "tests/reliability/test_concurrency.py": ("service", "pipeline"),   # make ui, a Prefect server, two dvc repro
    "tests/pipeline/test_flows.py::test_finetune_without_a_champion": ("pipeline",),
    "tests/pipeline/test_wmt14_pipeline.py": ("pipeline",),
    "tests/pipeline/experiments/test_sweep.py::test_a_two_point_sweep": ("pipeline",),
    "tests/pipeline/stages/test_download.py::test_stage_writes_the_corpus": ("pipeline",),
    "tests/pipeline/stages/test_download.py::test_bad_param_exits_2": ("pipeline",),
    "tests/pipeline/stages/test_download.py::test_data_error_exits_2": ("pipeline",),
    "tests/pipeline/stages/test_download.py::test_failed_download_under_dvc_repro": ("pipeline",),
    "tests/pipeline/stages/test_parent_death.py": ("pipeline",),   # process families killed and watched
    "tests/reliability/test_downloads.py::test_download_stage_rejects": ("pipeline",),
    "tests/reliability/test_kill_resume.py": ("pipeline", "training"),   # trainings in children, SIGKILLed
    "tests/reliability/test_graceful_stop.py": ("training",),
    "tests/transformer/test_trainer.py::test_resume_in_a_fresh_process_is_exact": ("training",),
    "tests/transformer/test_trainer_distributed.py": ("training",),   # gloo process groups
    "tests/transformer/test_trainer_distributed_resume.py": ("training",),
    "tests/transformer/test_trainer_distributed_stop.py": ("training",),
    "tests/pipeline/serving/test_export.py::test_greedy_matches_ctranslate2": ("training",),
    "tests/pipeline/serving/test_export.py::test_beam_agreement_reported": ("training",),
    "tests/pipeline/serving/test_export.py::test_command_line_export_int8": ("training",),
    "tests/bench/test_decode_speed.py": ("slow",),   # the benches, run as their commands
    "tests/bench/test_decode_latency.py": ("slow",),
    "tests/bench/test_train_throughput.py::test_train_bench_runs": ("slow",),
    "tests/bench/test_gpu_campaign.py": ("slow",),
    "tests/pipeline/workers/test_workspace.py::test_the_steps_clone_once": ("slow",),
}

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


def marks_of(nodeid: str, fixturenames: list[str]) -> set[str]:
    path = nodeid.split("::", 1)[0]
    parts = Path(path).parts
    marks = set()
    if len(parts) > 1 and parts[0] == "tests":
        marks.update(DIRECTORY_MARKS.get(parts[1], ()))
    for name in fixturenames:
        marks.update(FIXTURE_MARKS.get(name, ()))
    for prefix, names in MARKS.items():
        if nodeid == prefix or nodeid.startswith(prefix + ("::" if "::" not in prefix else "")):
            marks.update(names)
    return marks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:   # node ids are relative to the repository (pyproject.toml's folder)
        for name in sorted(marks_of(item.nodeid, getattr(item, "fixturenames", []))):
            item.add_marker(name)


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

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            shared = shared_fixture(path)
            return f"shared fixture {shared}" if shared else path

    return SharedFixtureScheduling(config, log)
