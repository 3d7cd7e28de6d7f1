"""pipeline/stages/train.py's process-group timeout, ``TRAIN_DIST_TIMEOUT_S``: its default, its
parsing, and a bad value refused in one line before a rank joins the process group or reads data.
The timeout at work (a host cut off) is in tests/team/test_two_host_training.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config.params import ParamsError
from pipeline.stages.train import DEFAULT_DIST_TIMEOUT_S, dist_timeout

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]


def test_timeout_default_and_override(monkeypatch):
    monkeypatch.delenv("TRAIN_DIST_TIMEOUT_S", raising=False)
    assert dist_timeout() == DEFAULT_DIST_TIMEOUT_S == 300.0
    monkeypatch.setenv("TRAIN_DIST_TIMEOUT_S", "12.5")
    assert dist_timeout() == 12.5
    for bad in ("abc", "0", "-3", "nan", "inf"):
        monkeypatch.setenv("TRAIN_DIST_TIMEOUT_S", bad)
        with pytest.raises(ParamsError, match=rf"TRAIN_DIST_TIMEOUT_S='{bad}': expected a positive number"):
            dist_timeout()


def test_bad_timeout_is_one_line_before_joining_the_group(tmp_path):
    """As torchrun starts each rank (WORLD_SIZE set): the stage refuses the value before it joins
    the process group or reads any data, so no rank waits for a peer that will never come."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")   # no data: the timeout is read first
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TRAIN_DIST_TIMEOUT_S": "soon", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "0"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == "error: TRAIN_DIST_TIMEOUT_S='soon': expected a positive number of seconds"
    assert time.monotonic() - started < 60   # no wait for a peer (the default timeout is 300 s)
