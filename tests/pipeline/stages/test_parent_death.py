"""pipeline/stages/parent_death.py: a process whose parent is SIGKILLed gets SIGTERM from the kernel,
through prctl in-process and through setpriv in front of a command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.stages.parent_death import with_parent_death_signal

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"),
              pytest.mark.pipeline]

# The grandchild: says it got SIGTERM in a file, as the train stage saves a checkpoint on SIGTERM.
GRANDCHILD = """
import os, signal, sys, time
from pathlib import Path
from pipeline.stages.parent_death import signal_when_parent_dies
def done(*_):
    Path(sys.argv[1] + ".tmp").write_text("SIGTERM")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])   # whole or absent: the test reads it as soon as it exists
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
{arm}
Path(sys.argv[1] + ".ready").write_text("")
time.sleep(60)
"""


def run_family(tmp_path: Path, arm: str, wrap: bool, bound_s: float = 30.0) -> Path:
    """A parent that starts the grandchild and sleeps; the parent is SIGKILLed once the grandchild is up."""
    marker = tmp_path / "marker"
    argv = [sys.executable, "-c", GRANDCHILD.format(arm=arm), str(marker)]
    argv = with_parent_death_signal(argv) if wrap else argv
    parent_code = f"import subprocess, time; subprocess.Popen({argv!r}); time.sleep(60)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=env)
    try:
        deadline = time.monotonic() + 30
        while not Path(str(marker) + ".ready").exists():
            assert time.monotonic() < deadline, "the grandchild did not start"
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + bound_s   # a bound, not a speed check (a loaded machine took 10 s once)
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    return marker


def test_a_stage_gets_sigterm_when_its_parent_is_killed(tmp_path):
    marker = run_family(tmp_path, "signal_when_parent_dies()", wrap=False)
    assert marker.read_text() == "SIGTERM"


def test_a_command_under_setpriv_gets_sigterm_when_its_parent_is_killed(tmp_path):
    if with_parent_death_signal(["x"]) == ["x"]:
        pytest.skip("util-linux's setpriv is not installed")
    marker = run_family(tmp_path, "", wrap=True)
    assert marker.read_text() == "SIGTERM"


def test_without_it_the_orphan_runs_on(tmp_path):
    """The reference: what happens without either (why pipeline/stages/parent_death.py exists)."""
    marker = run_family(tmp_path, "", wrap=False, bound_s=5.0)   # the kernel's signal comes at once or never
    assert not marker.exists()
    # the orphan is still there; end it
    for line in subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True).stdout.split():
        os.kill(int(line), signal.SIGKILL)
