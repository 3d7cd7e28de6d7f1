"""A sweep on the work pool: two workers against one, the same grid, one thread per point.

On one machine (root, network namespaces as in ``tests/team``): the stack on a bridge's address, the
repository served by ``git daemon``, the data stages pushed, and workers on second hosts
(``python -m pipeline.workers start --limit 1``, ``OMP_NUM_THREADS=1``). Each round runs a 4-point grid
of ``train.seed`` values as a sweep (``python -m pipeline.workers.sweep``) from submission to the last
point's end: first with one worker, then with two, each round on fresh workspaces and with seeds of
its own (a point never restores another round's outputs from the remote). The tiny preset trains
``--steps`` updates per point; everything else a point does (checkout, pulls, tune, evaluate,
pushes, the flow run's start) is in the time too, as a team's sweep pays it.

The last line is ``ratio=<two workers' wall time / one worker's>`` (goal: at most 0.6). Name the
CPU with the figure: both rounds share the machine's cores with the stack's servers.

    python bench/sweep_pool.py [--steps 600] [--points 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.team.sweep_team import SweepTeam, sweep_team  # noqa: E402

HOSTS = ("bench-a", "bench-b")


def round_seconds(team: SweepTeam, name: str, workers: tuple[str, ...], first_seed: int, points: int) -> float:
    """Wall time of one sweep over ``points`` seeds from ``first_seed`` with ``workers`` running."""
    grid = team.colleague.path / "params" / "sweep.yaml"
    grid.write_text("grid:\n  train.seed: [" + ", ".join(str(first_seed + i) for i in range(points)) + "]\n"
                    "proxy: {}\ntop: 1\n")
    team.colleague.run("git", "commit", "-qam", f"bench round {name}")
    pushed = team.colleague.run("git", "push", "-q", "origin", f"HEAD:refs/heads/{name}")
    assert pushed.returncode == 0, pushed.stderr
    for host in workers:
        team.start_worker(host, workspace=f"workspace-{name}")
    log = team.tmp / f"{name}.log"
    started = time.monotonic()
    process = team.sweep(name, log)
    code = process.wait(timeout=7200)
    seconds = time.monotonic() - started
    team.stop_workers()
    team.workers.clear()
    assert code == 0, log.read_text()[-3000:]
    print(f"{name}: {points} points on {len(workers)} worker(s): {seconds:.1f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="training updates per point (tiny preset)")
    parser.add_argument("--points", type=int, default=4)
    args = parser.parse_args()
    train = {"max_epochs": 0, "max_steps": args.steps, "checkpoint_every_steps": max(args.steps // 4, 1),
             "validate_every": args.steps, "log_every": max(args.steps // 4, 1)}
    with tempfile.TemporaryDirectory(prefix="sweep-pool-bench-") as tmp, \
            sweep_team(Path(tmp), HOSTS, {"train.seed": [1]}, train,
                       {"experiment": "sweep-pool-bench", "registered_model": "sweep-pool-bench"}) as team:
        one = round_seconds(team, "one-worker", HOSTS[:1], 100, args.points)
        two = round_seconds(team, "two-workers", HOSTS, 200, args.points)
    print(f"one worker {one:.1f} s, two workers {two:.1f} s ({args.points} points, {args.steps} updates each)")
    print(f"ratio={two / one:.2f}")


if __name__ == "__main__":
    main()
