"""``python -m pipeline.workers.sweep --pool POOL`` (``make sweep POOL=...``): params/sweep.yaml's grid
fanned out over the pool's workers, each point one flow run of the sweep's deployment, pinned to this
clone's commit (pushed to the repository the workers clone). Run with the team's env file sourced.

    python -m pipeline.workers.sweep --pool gpu                            # proxy phase: sweep proxy-<time>
    python -m pipeline.workers.sweep --pool gpu --sweep proxy-1203-0130    # rerun: finished points skipped,
                                                                           # crashed ones resumed
    python -m pipeline.workers.sweep --pool gpu --phase final --sweep proxy-1203-0130 --top 2
                                                   # the 2 best points by valid_bleu on the server, full
                                                   # runs: sweep proxy-1203-0130-final (a rerun: the same
                                                   # points, whatever the ranking says since)

Then ``make compare SWEEP=<name>`` ranks the sweep's runs and ``make sweep-apply SWEEP=<name>`` applies
the winner. Exit 0 when every point finished, 1 when one did not (rerun to resume), 2 on bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from pipeline.workers.deploy import HEARTBEAT_GRACE_S


def origin_url() -> str:
    proc = subprocess.run(["git", "remote", "get-url", "origin"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0915 (the command's one sequence)
    from pipeline.workers.__main__ import _seconds

    parser = argparse.ArgumentParser(prog="python -m pipeline.workers.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool", required=True, help="the team's work pool")
    parser.add_argument("--sweep", help="the sweep's name (default: proxy-<time>); final phase: the proxy sweep "
                                        "whose best points it runs in full")
    parser.add_argument("--phase", choices=("proxy", "final"), default="proxy")
    parser.add_argument("--top", type=int, help="final phase: how many points (default: top in the sweep file)")
    parser.add_argument("--file", type=Path, default=Path("params/sweep.yaml"), help="the sweep file")
    parser.add_argument("--repository", help="the git URL the workers clone (default: this clone's origin)")
    parser.add_argument("--commit", default="HEAD", help="the commit the points run (default HEAD)")
    parser.add_argument("--allow-uncommitted", action="store_true",
                        help="sweep although the working tree differs from the commit in what the workers run")
    parser.add_argument("--crash-grace", type=_seconds, default=HEARTBEAT_GRACE_S, metavar="SECONDS",
                        help="a point whose worker died is Crashed after 30 s + this without a heartbeat")
    args = parser.parse_args(argv)

    from pipeline.config.errors import ParamsError
    from pipeline.config.params import load_params
    from pipeline.experiments.sweep import SweepError, load_sweep
    from pipeline.experiments.sweep_points import SweepNameError, check_sweep_name, plan, point_runs, top_points
    from pipeline.flows.preflight import PrefectPreflightError, check_prefect_server
    from pipeline.tracking.preflight import PreflightError, check_tracking_server
    from pipeline.workers.__main__ import DeployError, api_url, check_pushed, resolve_commit
    from pipeline.workers.deploy import WorkingTreeError, check_working_tree
    from pipeline.workers.sweep.deploy import PinnedElsewhere, deploy_sweep
    from pipeline.workers.sweep.fanout import (
        FanoutError,
        Point,
        describe,
        finished_experiments,
        follow,
        online_queues,
        submit,
    )
    from pipeline.workers.workspace import WorkspaceError

    try:
        if args.top is not None and args.top < 1:
            raise SweepError(f"--top must be positive, got {args.top}")
        params = load_params()
        sweep = load_sweep(args.file)
        repository = args.repository or origin_url()
        if not repository:
            raise DeployError("this clone has no remote origin: --repository names the git URL the workers clone")
        commit = resolve_commit(args.commit)
        check_pushed(repository, commit)
        warning = check_working_tree(commit, args.allow_uncommitted)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        print(f"orchestration: {check_prefect_server(api_url())}", flush=True)
        print(f"tracking: {check_tracking_server()}", flush=True)
        if args.phase == "proxy":
            name = check_sweep_name(args.sweep or f"proxy-{time.strftime('%m%d-%H%M%S')}")
            points = [Point({**values, **sweep.proxy}, values) for values in sweep.points()]
        else:
            if not args.sweep:
                raise SweepError("--phase final takes the best points of a sweep: name it with --sweep")
            source = check_sweep_name(args.sweep)
            name = check_sweep_name(f"{source}-final")
            earlier = point_runs(name)
            if earlier and all(run.values is not None for run in earlier.values()):
                # A rerun: the points the first call chose, whatever the proxy ranking says now.
                best = [earlier[i].values for i in sorted(earlier)]
            else:
                best = top_points(params.tracking.experiment, source, args.top or sweep.top)
            if not best:
                raise SweepError(f"no run of sweep {source!r} has a validation score on the tracking server "
                                 f"(experiment {params.tracking.experiment!r}): run its proxy phase on the pool "
                                 "first (a local sweep's runs carry no point's values)")
            points = [Point({**values, **sweep.final}, values) for values in best]
        deployed = deploy_sweep(repository, commit, args.pool, name, args.crash_grace)
        steps = plan([p.values for p in points], name, finished_experiments(repository, commit, name),
                     point_runs(name), online_queues(args.pool))
    except (ParamsError, SweepError, SweepNameError, DeployError, WorkingTreeError, WorkspaceError, PinnedElsewhere,
            PrefectPreflightError, PreflightError, FanoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:   # noqa: BLE001 (a server's answer, whatever its client raised for it)
        print(f"error: {type(err).__name__}: {' '.join(str(err).split())[:400]}", file=sys.stderr)
        return 2

    print(f"sweep {name}: {len(points)} point(s) of {deployed.name} in pool {args.pool!r}, commit {commit[:12]}",
          flush=True)
    print("\n".join(describe(steps, points)), flush=True)
    again = f"`make sweep POOL={args.pool} SWEEP={name if args.phase == 'proxy' else args.sweep}" + (
        " PHASE=final`" if args.phase == "final" else "`")
    try:
        ids = submit(deployed.deployment_id, name, steps, points)
        final = follow(ids, points, out=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print(f"\nstopped following: the points go on on the workers; {again} follows them again", file=sys.stderr)
        return 130
    except Exception as err:   # noqa: BLE001 (the Prefect server away, mid-follow)
        print(f"error: {type(err).__name__}: {' '.join(str(err).split())[:400]}; the points go on on the workers: "
              f"{again} follows them again", file=sys.stderr)
        return 2
    done = sum(1 for s in steps if s.action == "finished") + sum(1 for state, _ in final.values()
                                                                  if state == "COMPLETED")
    print(f"\nsweep {name}: {done} of {len(points)} point(s) finished", flush=True)
    if done < len(points):
        print(f"error: {len(points) - done} point(s) did not finish; rerun {again}: finished points are skipped, "
              "a crashed one resumes on its worker", file=sys.stderr)
        return 1
    print(f"ranking: make compare SWEEP={name}\nthe winner: make sweep-apply SWEEP={name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
