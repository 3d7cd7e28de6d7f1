"""pipeline/stages/malloc.py: the allocator a training process runs on, chosen once by starting the process
again; real processes, their memory maps and environments read back; a training's checkpoints the same
bytes on every allocator."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.config.errors import ParamsError
from pipeline.stages import malloc
from transformer.training.token_store import write_token_store

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]
TCMALLOC = malloc.find_tcmalloc()

# What the started-again process reports: the line it printed, whether tcmalloc is mapped into it, its
# GLIBC_TUNABLES and its process id (os.execve keeps it).
PROBE = """
import os
print("BEFORE", os.getpid(), flush=True)
from pipeline.stages.malloc import restart_on_chosen_malloc
restart_on_chosen_malloc()
maps = open("/proc/self/maps").read()
print("PID", os.getpid())
print("TCMALLOC", "libtcmalloc" in maps)
print("TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))
"""


def clean_env(**env: str) -> dict[str, str]:
    """This process's environment without an allocator choice of its own, plus ``env``."""
    clean = {k: v for k, v in os.environ.items()
             if k not in (malloc.MALLOC_ENV, malloc.APPLIED_ENV, "LD_PRELOAD", "GLIBC_TUNABLES")}
    return {**clean, "PYTHONPATH": str(REPO), **env}


def probe(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=clean_env(**env))


def field(out: str, name: str) -> str:
    return next(line.split(" ", 1)[1] if " " in line else "" for line in out.splitlines() if line.startswith(name))


# ---------------------------------------------------------------- the plan
def test_auto_takes_tcmalloc_where_its_library_is_and_keeps_what_was_preloaded(tmp_path):
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    chosen = malloc.plan({"LD_PRELOAD": "/opt/other.so"}, library_dirs=[str(tmp_path / "none"), str(tmp_path)],
                         platform="linux")
    assert chosen.name == "tcmalloc"
    assert chosen.env == {"LD_PRELOAD": f"/opt/other.so {tmp_path / 'libtcmalloc_minimal.so.4'}"}
    assert chosen.describe() == f"malloc: tcmalloc ({tmp_path / 'libtcmalloc_minimal.so.4'})"
    assert malloc.plan({malloc.MALLOC_ENV: "tcmalloc"}, [str(tmp_path)], "linux").name == "tcmalloc"


def test_without_tcmalloc_auto_tunes_glibc_and_says_what_to_install(tmp_path):
    chosen = malloc.plan({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, [str(tmp_path)], "linux")
    assert chosen.name == "glibc"
    assert chosen.env == {"GLIBC_TUNABLES": f"glibc.pthread.rseq=0:{malloc.GLIBC_TUNABLES}"}
    assert "apt-get install libtcmalloc-minimal4" in chosen.describe()
    assert malloc.plan({malloc.MALLOC_ENV: "glibc"}, [str(tmp_path)], "linux").env == {
        "GLIBC_TUNABLES": malloc.GLIBC_TUNABLES}


def test_system_and_other_platforms_set_nothing(tmp_path):
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert malloc.plan({malloc.MALLOC_ENV: "system"}, [str(tmp_path)], "linux").env == {}
    assert malloc.plan({}, [str(tmp_path)], "darwin") == malloc.MallocPlan("system", {})


def test_a_bad_value_or_a_missing_tcmalloc_is_one_clear_error(tmp_path):
    with pytest.raises(ParamsError,
                       match=r"^PIPELINE_MALLOC='jemalloc': must be one of auto, tcmalloc, glibc, system$"):
        malloc.plan({malloc.MALLOC_ENV: "jemalloc"}, [str(tmp_path)], "linux")
    with pytest.raises(ParamsError, match=r"PIPELINE_MALLOC=tcmalloc: none of .* \(Debian: apt-get install "
                                          r"libtcmalloc-minimal4\)$"):
        malloc.plan({malloc.MALLOC_ENV: "tcmalloc"}, [str(tmp_path)], "linux")


# ---------------------------------------------------------------- real processes
def test_the_process_starts_again_once_on_the_chosen_allocator():
    result = probe()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert field(out, "BEFORE") == field(out, "PID")   # os.execve: the same process
    assert out.count("BEFORE") == 2 and out.count("malloc: ") == 1, out   # once, not in a loop
    if TCMALLOC:
        assert field(out, "TCMALLOC") == "True" and f"malloc: tcmalloc ({TCMALLOC})" in out
    else:
        assert field(out, "TUNABLES") == malloc.GLIBC_TUNABLES and "malloc: glibc" in out


def test_system_starts_nothing_again():
    result = probe(**{malloc.MALLOC_ENV: "system"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("BEFORE") == 1
    assert field(result.stdout, "TCMALLOC") == "False" and field(result.stdout, "TUNABLES") == ""
    assert "malloc: the system's, as started" in result.stdout


def test_the_train_stage_stops_on_a_bad_value_with_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=tmp_path,
                            env=clean_env(**{malloc.MALLOC_ENV: "fast"}),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: PIPELINE_MALLOC='fast': must be one of auto, tcmalloc, glibc, system"]


def test_the_stage_called_in_a_process_of_its_own_starts_nothing_again(monkeypatch):
    """``main`` (what tests and other callers run in their own process) never executes anew: that
    would start the caller again; only the stage run as a program does (``python -m pipeline.stages.train``)."""
    from pipeline.stages import train

    monkeypatch.setattr(os, "execve", lambda *args: pytest.fail(f"os.execve{args[:2]}"))
    monkeypatch.setattr(train, "launch_if_asked", lambda: 0)   # what main does first after its arguments
    monkeypatch.setattr(sys, "argv", ["train"])
    with pytest.raises(SystemExit) as stopped:
        train.main()
    assert stopped.value.code == 0


@pytest.mark.training
def test_a_training_writes_the_same_checkpoints_on_every_allocator(tmp_path):
    """tests/reliability/train_child.py (tiny preset, dropout, accumulation) for 6 updates on glibc's
    malloc as started, on glibc tuned and, where installed, on tcmalloc: the same bytes."""
    rng = np.random.default_rng(5)
    pairs = [(rng.integers(4, 40, size=rng.integers(2, 12)).tolist(),
              rng.integers(4, 40, size=rng.integers(2, 12)).tolist()) for _ in range(60)]
    store = write_token_store(tmp_path / "train", pairs, vocab_size=40).path
    child = REPO / "tests" / "reliability" / "train_child.py"
    allocators = {"system": {}, "glibc": malloc.plan({malloc.MALLOC_ENV: "glibc"}).env}
    if TCMALLOC:
        allocators["tcmalloc"] = malloc.plan({malloc.MALLOC_ENV: "tcmalloc"}).env
    digests = {}
    for name, extra in allocators.items():
        out = tmp_path / name
        result = subprocess.run([sys.executable, str(child), str(store), str(out), "6"], cwd=REPO,
                                env=clean_env(OMP_NUM_THREADS="1", **extra), capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr
        digests[name] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.pt"))}
    assert len(digests["system"]) >= 3
    assert all(found == digests["system"] for found in digests.values()), digests
