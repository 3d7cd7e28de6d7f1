"""tests/conftest.py's tiers: a test module without a tier marker fails collection (so no test
lands in ``make test-fast`` by a name nobody listed), and a module's tier reaches each of its tests,
beside a costlier one a test carries itself. Run as pytest itself runs them, in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"


def collect(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *args, str(folder)], cwd=folder, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_a_module_without_a_tier_fails_collection(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tiered.py").write_text("import pytest\n\npytestmark = pytest.mark.fast\n\n\n"
                                             "def test_a():\n    pass\n\n\n"
                                             "@pytest.mark.training\ndef test_b():\n    pass\n")
    (tmp_path / "test_untiered.py").write_text("def test_renamed():\n    pass\n")
    failed = collect(tmp_path)
    assert failed.returncode == 4, failed.stdout + failed.stderr
    assert "test module(s) without a tier: test_untiered.py; give each a `pytestmark` of pytest.mark.fast" in (
        failed.stdout + failed.stderr)
    (tmp_path / "test_untiered.py").unlink()
    quick = collect(tmp_path, "-m", "not service and not pipeline and not training and not slow")
    assert quick.returncode == 0 and "test_tiered.py::test_a" in quick.stdout, quick.stdout + quick.stderr
    assert "test_b" not in quick.stdout and "1/2 tests collected" in quick.stdout
