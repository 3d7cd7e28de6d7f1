"""Memory of the team's services (``make stack``): each service's process tree (the recorded PID
and its descendants, e.g. PostgreSQL's backends, MLflow's workers) as proportional set size (PSS:
memory shared between processes, such as PostgreSQL's shared buffers, counted once), sampled every
``--every`` seconds for ``--seconds``; prints the first sample (idle, when started before a run)
and the peak per service. Run it beside ``make run`` to see them during a run.

    python bench/stack_memory.py --seconds 1200 --every 5 [--dir .stack]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from pipeline.stack.processes import read_pid


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_tree_pss_mib(root: int) -> float:
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += _pss_kib(pid)
        todo += children.get(pid, [])
    return total / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(".stack"))
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--every", type=float, default=5)
    args = parser.parse_args()
    pids = {f.stem: read_pid(f) for f in sorted((args.dir / "run").glob("*.pid"))}
    first: dict[str, float] = {}
    peak: dict[str, float] = defaultdict(float)
    deadline = time.monotonic() + args.seconds
    while True:
        for name, pid in pids.items():
            if pid is not None:
                mib = process_tree_pss_mib(pid)
                first.setdefault(name, mib)
                peak[name] = max(peak[name], mib)
        if time.monotonic() >= deadline:
            break
        time.sleep(args.every)
    for name in pids:
        print(f"{name:9s} first {first.get(name, 0):7.0f} MiB   peak {peak.get(name, 0):7.0f} MiB", flush=True)
    print(f"total     first {sum(first.values()):7.0f} MiB   peak {sum(peak.values()):7.0f} MiB")


if __name__ == "__main__":
    main()
