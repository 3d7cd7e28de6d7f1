"""Smoke tests of the benchmarks: each runs as ``make bench`` runs it, in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``python bench/<script> <args>`` from ``cwd`` with the repository importable; fails on a non-zero exit."""
    result = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result
