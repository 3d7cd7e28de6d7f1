"""Resident memory of the team's services (``make stack``): each service's process tree (the
recorded PID and its descendants, e.g. PostgreSQL's backends, MLflow's workers), sampled every
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


def process_tree_rss_mib(root: int) -> float:
    children: dict[int, list[int]] = defaultdict(list)
    rss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        pid = int(fields["Pid"])
        children[int(fields["PPid"])].append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
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
                mib = process_tree_rss_mib(pid)
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
