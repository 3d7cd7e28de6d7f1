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


def probe(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in (malloc.MALLOC_ENV, malloc.APPLIED_ENV, "LD_PRELOAD", "GLIBC_TUNABLES")}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**clean, "PYTHONPATH": str(REPO), **env})


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
    env = {**os.environ, "PYTHONPATH": str(REPO), malloc.MALLOC_ENV: "fast"}
    result = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: PIPELINE_MALLOC='fast': must be one of auto, tcmalloc, glibc, system"]


@pytest.mark.training
def test_a_training_writes_the_same_checkpoints_on_every_allocator(tmp_path):
    """tests/reliability/train_child.py (tiny preset, dropout, accumulation) for 6 updates, once as
    started and once on the allocator ``auto`` chooses here (tcmalloc, or glibc tuned)."""
    rng = np.random.default_rng(5)
    pairs = [(rng.integers(4, 40, size=rng.integers(2, 12)).tolist(),
              rng.integers(4, 40, size=rng.integers(2, 12)).tolist()) for _ in range(60)]
    store = write_token_store(tmp_path / "train", pairs, vocab_size=40).path
    child = REPO / "tests" / "reliability" / "train_child.py"
    digests = {}
    for name, extra in (("system", {}), ("auto", malloc.plan(os.environ).env)):
        out = tmp_path / name
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}
        result = subprocess.run([sys.executable, str(child), str(store), str(out), "6"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        digests[name] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.pt"))}
    assert len(digests["system"]) >= 3
    assert digests["auto"] == digests["system"]
