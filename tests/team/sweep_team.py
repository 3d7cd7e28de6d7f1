"""A team for sweeps on a work pool, on one machine: the stack on a bridge's address, the project's
repository served by ``git daemon``, the data stages made and pushed by a first machine, a colleague's
clone where sweeps are typed, and workers started on second hosts (network namespaces), each with a
workspace of its own. Shared by ``tests/team/test_sweep_pool.py`` and ``bench/sweep_pool.py``."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..pipeline.conftest import TINY, make_workspace, orchestration_params
from . import hosts
from .conftest import PYTHON, Stack, running_stack
from .test_two_machines import Machine, sourced
from .test_worker import clean_env, made_and_pushed, serve_repository, stop

POOL = "sweep-pool"


@dataclass
class Worker:
    name: str
    process: subprocess.Popen
    workspace: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class SweepTeam:
    network: hosts.Network
    stack: Stack
    colleague: Machine          # a clone of the repository, where sweeps are typed
    repository: str
    commit: str
    tmp: Path
    workers: dict[str, Worker] = field(default_factory=dict)

    def start_worker(self, host: str, workspace: str = "workspace") -> Worker:
        """``python -m pipeline.workers start --pool ... --name <host> --limit 1`` on ``host``, one
        thread (``OMP_NUM_THREADS=1``), the stack's env file sourced, its workspace ``workspace``."""
        home = self.tmp / host
        env = sourced(self.stack.directory / "env", clean_env(home))
        env.update(TEAM_WORKSPACE=str(home / workspace), PREFECT_WORKER_QUERY_SECONDS="2")
        log = home / "worker.log"
        with log.open("ab") as sink:
            process = self.network.hosts[host].popen(
                [PYTHON, "-m", "pipeline.workers", "start", "--pool", POOL, "--name", host, "--limit", "1"],
                cwd=home, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers[host] = Worker(host, process, home / workspace, log)
        return self.workers[host]

    def stop_workers(self) -> None:
        for worker in self.workers.values():
            stop(worker.process, signal.SIGINT)

    def sweep(self, name: str, log: Path, *extra: str) -> subprocess.Popen:
        """``python -m pipeline.workers.sweep --pool ... --sweep <name>`` in the colleague's clone."""
        with log.open("wb") as sink:
            return subprocess.Popen([PYTHON, "-m", "pipeline.workers.sweep", "--pool", POOL, "--sweep", name, *extra],
                                    cwd=self.colleague.path, env=self.colleague.env, stdout=sink,
                                    stderr=subprocess.STDOUT)


@contextmanager
def sweep_team(tmp: Path, host_names: tuple[str, ...], grid: dict[str, list[Any]], train: dict[str, Any],
               tracking: dict[str, str]) -> Iterator[SweepTeam]:
    """The team, with ``params/sweep.yaml`` holding ``grid`` (no proxy overrides) and the tiny
    params of one decoding point (``orchestration_params``) with ``train`` and ``tracking`` on top."""
    with hosts.Network(host_names) as network, running_stack(network.server_address) as stack:
        params = orchestration_params({"train": {**TINY["train"], **train}, "tracking": tracking})
        root, env = make_workspace(tmp / "first" / "repo", params)
        env.pop("MLFLOW_TRACKING_URI")
        (root / "params").mkdir()
        (root / "params" / "sweep.yaml").write_text(yaml.safe_dump({"grid": grid, "proxy": {}, "top": 1},
                                                                   sort_keys=False))
        first, commit = made_and_pushed(Machine(root, sourced(stack.directory / "env", env)), "tokenizer",
                                        "references")

        daemon, repository = serve_repository(root, tmp / "git" / "translator.git", network.server_address)
        team = None
        try:
            clone = tmp / "colleague"
            subprocess.run(["git", "clone", "-q", repository, str(clone)], check=True)
            colleague = Machine(clone, {**first.env, "PYTHONPATH": str(clone)})
            assert colleague.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
            team = SweepTeam(network, stack, colleague, repository, commit, tmp)
            yield team
        finally:
            if team is not None:
                team.stop_workers()
            stop(daemon)
