"""``python -m pipeline.workers deploy``: deploy the retraining flow to a work pool, its code pinned
to a commit of the repository the workers clone. Run in a clone of that repository, with the team's
env file sourced (``PREFECT_API_URL`` and its auth); the schedule is params.yaml's ``flows`` section.

    python -m pipeline.workers deploy --repository git://team-server/translator.git --pool gpu
    python -m pipeline.workers start --pool gpu --limit 1   # on each worker host: see docs/team.md

``start`` is ``prefect worker start`` (options after ``--pool`` and ``--name`` pass through) with
SIGINT at its default action whatever the starting shell left it at, so SIGINT stops it
(``pipeline.workers.start``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipeline.workers.deploy import HEARTBEAT_GRACE_S, HEARTBEAT_S


class DeployError(ValueError):
    pass


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def resolve_commit(ref: str) -> str:
    proc = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if proc.returncode != 0:
        raise DeployError(f"--commit: {ref!r} is not a commit of this clone")
    return proc.stdout.strip()


def check_pushed(repository: str, commit: str) -> None:
    """The workers fetch ``repository``: the commit must be on one of its branches or tags."""
    proc = _git("ls-remote", repository)
    if proc.returncode != 0:
        raise DeployError(f"--repository: git ls-remote {repository} failed: {proc.stderr.strip()}")
    tips = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    if commit in tips:
        return
    for tip in tips:
        if _git("merge-base", "--is-ancestor", commit, tip).returncode == 0:
            return
    raise DeployError(f"--commit {commit[:12]} is on no branch or tag of {repository} known here: push it "
                      "first (and fetch, if it was pushed from elsewhere)")


def api_url() -> str:
    """The Prefect API the deployment goes to: ``PREFECT_API_URL`` (the team's server, from its env file)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise DeployError("PREFECT_API_URL is not set: the deployment goes to the team's Prefect server "
                          "(`source .stack/env`)")
    return url


def _seconds(text: str) -> int:
    """A whole number of seconds, at least 1 (argparse's type: its message names the option)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of seconds >= 1, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.workers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    deploy = commands.add_parser("deploy", help="create or update the team-retraining deployment")
    deploy.add_argument("--repository", required=True, help="git URL the workers clone (and push results to)")
    deploy.add_argument("--commit", default="HEAD", help="the commit to pin (a ref of this clone; default HEAD)")
    deploy.add_argument("--pool", required=True, help="the work pool (created as a process pool if missing)")
    deploy.add_argument("--results-branch", default=None,
                        help="branch the workers push dvc.lock to (default: retraining/results)")
    deploy.add_argument("--paused", action="store_true", help="create it with its schedule paused")
    deploy.add_argument("--allow-uncommitted", action="store_true",
                        help="deploy although dvc.yaml, dvc.lock, params.yaml or a stage's code differ in the "
                             "working tree from the pinned commit (a warning instead of a refusal)")
    deploy.add_argument("--params", type=Path, default=Path("params.yaml"), help="params file (flows section)")
    deploy.add_argument("--crash-grace", type=_seconds, default=HEARTBEAT_GRACE_S, metavar="SECONDS",
                        help=f"a run is marked Crashed (its slot freed) after {HEARTBEAT_S} s + this without a "
                             f"heartbeat: its worker stopped or its host died (default {HEARTBEAT_GRACE_S})")
    start = commands.add_parser("start", help="start a Prefect worker on a pool; SIGINT stops it whatever the "
                                "starting shell ignored (prefect worker start's other options pass through)")
    start.add_argument("--pool", required=True, help="the work pool (the deployment's)")
    start.add_argument("--name", help="the worker's name, unique in the pool: it names the worker's own queue "
                                      "on-<name> (default: the host's name)")
    args, extra = parser.parse_known_args(argv)
    if args.command == "start":
        return start_worker(args.pool, args.name, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    from pipeline.config.params import ParamsError, load_params
    from pipeline.flows.preflight import PrefectPreflightError, check_prefect_server
    from pipeline.workers.deploy import WorkingTreeError, check_working_tree
    from pipeline.workers.deploy import deploy as deploy_flow
    from pipeline.workers.flow import DEFAULT_BRANCH
    from pipeline.workers.results import ResultsError
    from pipeline.workers.workspace import WorkspaceError

    try:
        flows = load_params(args.params).flows
        commit = resolve_commit(args.commit)
        check_pushed(args.repository, commit)
        warning = check_working_tree(commit, args.allow_uncommitted)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        check_prefect_server(api_url())
        deployed = deploy_flow(args.repository, commit, args.pool, flows,
                               results_branch=args.results_branch or DEFAULT_BRANCH, paused=args.paused,
                               crash_grace_s=args.crash_grace)
    except (ParamsError, DeployError, WorkspaceError, ResultsError, WorkingTreeError, PrefectPreflightError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"deployment {deployed.name} ({deployed.deployment_id}) in pool {deployed.pool!r}: commit {commit}, "
          f"schedule {flows.schedule_cron!r} ({flows.schedule_timezone}), one run at a time", flush=True)
    print(f"run it now: prefect deployment run '{deployed.name}'", flush=True)
    return 0


def start_worker(pool: str, name: str | None, extra: list[str]) -> int:
    """Exec the worker (does not return), or one ``error:`` line and 2."""
    from pipeline.workers.queues import ensure_queue, own_queue, worker_name
    from pipeline.workers.start import WorkerStartError, exec_worker, worker_command

    name = worker_name(name)
    try:
        command = worker_command(pool, name, extra)
        api_url()
        ensure_queue(pool, own_queue(name))
    except (WorkerStartError, DeployError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:   # noqa: BLE001 (the server's answer, whatever Prefect raised for it)
        print(f"error: work queue {own_queue(name)} of pool {pool!r} could not be made on {api_url()}: "
              f"{type(err).__name__} {' '.join(str(err).split())[:300]}".rstrip(), file=sys.stderr)
        return 2
    exec_worker(command, own_queue(name))
    return 0   # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
