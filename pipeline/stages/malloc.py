"""The C allocator a training process runs on (#56): tcmalloc where the machine has it.

PyTorch takes a CPU tensor's memory from the C library's ``malloc`` and frees it when the tensor goes,
hundreds of times an update. On 2 AMD EPYC cores with AVX512-BF16 the trainer's whole step ran
1.05-1.38x faster in four runs with Debian's ``libtcmalloc-minimal4`` preloaded, and 1.06-1.18x with
glibc's own allocator kept from handing memory back to the kernel (``GLIBC_TUNABLES``: no ``mmap``
below 32 MiB, no trimming); jemalloc was slower (0.71-0.78x): ``bench/train_step.py --levers
malloc_system,malloc_glibc,jemalloc`` (docs/benchmarks.md). The allocator changes where bytes live, never their
values: a training writes the same checkpoints on any of them (tests/pipeline/stages/test_malloc.py).

The allocator of a process is fixed when it starts, so the stage starts itself again, once, with
the environment set (``os.execve``: the same process id, arguments and parent) before it trains. The
processes it launches (``train.processes``) inherit it. ``PIPELINE_MALLOC`` chooses:

- ``auto`` (unset): tcmalloc when its library is found (``TCMALLOC_LIBRARIES`` in ``LIBRARY_DIRS``),
  else glibc tuned;
- ``tcmalloc``: tcmalloc, or an error naming the package when it is missing;
- ``glibc``: glibc tuned; ``system``: the process as started, nothing set.

An environment variable, not a params.yaml key, because it changes nothing in what is trained.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.errors import ParamsError

MALLOC_ENV = "PIPELINE_MALLOC"
CHOICES = ("auto", "tcmalloc", "glibc", "system")
# Set in the started-again process: the choice is made once, never in a loop of executions.
APPLIED_ENV = "PIPELINE_MALLOC_APPLIED"
TCMALLOC_LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"   # Debian's; RHEL's gperftools-libs has the same library
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib")
# glibc's malloc keeps what it frees: blocks up to the 32 MiB maximum come from the heap, not from a
# fresh mmap, and the heap is never trimmed back (its default thresholds are 128 KiB, then adapt).
GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


@dataclass(frozen=True)
class MallocPlan:
    """What to add to the environment before the process starts again (``{}``: start nothing)."""

    name: str
    env: dict[str, str]
    library: str = ""   # tcmalloc's path

    def describe(self) -> str:
        if self.name == "tcmalloc":
            return f"malloc: tcmalloc ({self.library})"
        if self.name == "glibc":
            return (f"malloc: glibc, kept from returning memory to the kernel (GLIBC_TUNABLES); "
                    f"tcmalloc trains faster: apt-get install {TCMALLOC_PACKAGE}")
        return "malloc: the system's, as started"


def find_tcmalloc(library_dirs: Sequence[str] = LIBRARY_DIRS) -> str | None:
    """The path of a tcmalloc library in ``library_dirs``, or ``None``."""
    for directory in library_dirs:
        for name in TCMALLOC_LIBRARIES:
            if (path := Path(directory) / name).is_file():
                return str(path)
    return None


def plan(env: Mapping[str, str], library_dirs: Sequence[str] = LIBRARY_DIRS,
         platform: str = sys.platform) -> MallocPlan:
    """The allocator ``PIPELINE_MALLOC`` asks for on this machine; ``ParamsError`` for an unknown value or a
    tcmalloc asked for by name that is not installed."""
    choice = env.get(MALLOC_ENV, "").strip() or "auto"
    if choice not in CHOICES:
        raise ParamsError(f"{MALLOC_ENV}={choice!r}: must be one of {', '.join(CHOICES)}")
    if choice == "system" or not platform.startswith("linux"):
        return MallocPlan("system", {})
    library = find_tcmalloc(library_dirs) if choice in ("auto", "tcmalloc") else None
    if choice == "tcmalloc" and library is None:
        raise ParamsError(f"{MALLOC_ENV}=tcmalloc: none of {', '.join(TCMALLOC_LIBRARIES)} in "
                          f"{', '.join(library_dirs)} (Debian: apt-get install {TCMALLOC_PACKAGE})")
    if library is not None:
        preload = " ".join(part for part in (env.get("LD_PRELOAD", ""), library) if part)
        return MallocPlan("tcmalloc", {"LD_PRELOAD": preload}, library)
    tunables = ":".join(part for part in (env.get("GLIBC_TUNABLES", ""), GLIBC_TUNABLES) if part)
    return MallocPlan("glibc", {"GLIBC_TUNABLES": tunables})


def restart_on_chosen_malloc() -> None:
    """Start this process again with the allocator ``plan`` chooses (once); returns where nothing is to be
    set or it is set already, after one line saying which allocator the process runs on."""
    if os.environ.get(APPLIED_ENV):
        print(os.environ[APPLIED_ENV], flush=True)
        return
    chosen = plan(os.environ)
    if not chosen.env:
        print(chosen.describe(), flush=True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, **chosen.env, APPLIED_ENV: chosen.describe()})
