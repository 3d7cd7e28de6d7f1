"""The collection guard for the team tests' packages: a module is known to need requirements-stack.txt
when it, or a test module it imports relatively, imports one of its packages at the top; so that
``make test-fast`` on a clone without ``make stack-deps`` skips those modules instead of stopping
the collection with ``No module named 'boto3'``."""

from __future__ import annotations

from pathlib import Path

import pytest

from .stack_packages import STACK_MODULES, top_level_imports

pytestmark = pytest.mark.service

HERE = Path(__file__).parent


def test_a_module_importing_a_stack_package_through_a_sibling_is_found(tmp_path: Path) -> None:
    package = tmp_path / "tests" / "team"
    package.mkdir(parents=True)
    (tmp_path / "tests" / "pipeline").mkdir()
    (tmp_path / "tests" / "pipeline" / "conftest.py").write_text("import yaml\n")
    (package / "test_a.py").write_text("import os\nfrom .test_b import helper\nfrom ..pipeline.conftest import x\n")
    (package / "test_b.py").write_text("import boto3\nfrom .test_a import y\n\ndef helper():\n    import psycopg2\n")
    (package / "test_c.py").write_text("from .missing import z\n")
    (package / "test_d.py").write_text("from . import test_b, missing\n")

    assert top_level_imports(package / "test_a.py") == {"os", "boto3", "yaml"}   # the cycle back to test_a ends
    assert top_level_imports(package / "test_b.py") == {"boto3", "os", "yaml"}   # not psycopg2, imported in a function
    assert top_level_imports(package / "test_c.py") == set()                      # no file: left to the import
    assert top_level_imports(package / "test_d.py") == {"boto3", "os", "yaml"}


def test_the_fault_modules_that_import_test_faults_are_known_to_need_boto3() -> None:
    for name in ("test_faults.py", "test_tracking_faults.py", "test_orchestration_errors.py"):
        assert "boto3" in top_level_imports(HERE / name) & set(STACK_MODULES), name
