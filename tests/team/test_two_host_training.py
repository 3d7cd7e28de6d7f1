"""Training across two hosts for real: ``torchrun`` with a c10d rendezvous between two network
namespaces (``hosts.Network``: own address, hostname and hosts file each), gloo, and the pipeline's
own train stage (``python -m pipeline.stages.train``, tiny preset) in a workspace per host, as two
machines each have their own disk.

- Two hosts end with the weights of one process that accumulates the same global batches
  (``update_freq`` 2 of ``max_tokens`` / 2: rank r's batches are the r-th of each pair,
  ``TokenBatchSampler``; ``train.max_tokens`` counts a batch in all processes), under ``torchrun``
  and with the stage launching its process itself (``PIPELINE_NNODES``, ``pipeline.stages.launch``).
- A rank SIGKILLed mid-run: the other host's torchrun exits non-zero with the stage's one-line
  error within ``TRAIN_DIST_TIMEOUT_S`` plus a margin; the rerun resumes from the newest checkpoint
  on both hosts (host-b has none of its own) and ends with the uninterrupted weights.
- A host cut off (its link down, so no connection is closed, as when a machine loses power): the
  other host's training stops after ``TRAIN_DIST_TIMEOUT_S``, not gloo's 30 minutes.
- A SIGTERM to host-b's rank only (a scheduler preempting one machine), with dropout 0.1: both ranks
  stop after the same update (the vote in the update's all-reduce, ``transformer/training/stopping.py``), host-a
  holds the one resume point (with both ranks' RNG states), both stages exit 143, and the rerun ends
  with the weights of an uninterrupted two-host run, ``torch.equal``.

``-s`` prints the wall times of two hosts and of one process (the figures of docs/two_hosts.md).
Skipped where network namespaces cannot be made (not root, no iproute2) or the Multi30k mirror is
missing. Every process is stopped by the PID recorded at its start (the agent) or found below it.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from transformer.checkpoint import load_checkpoint
from transformer.config import ModelConfig
from transformer.model import Transformer
from transformer.training.trainer import list_checkpoints

from ..pipeline.conftest import BIN, TINY, make_workspace, tiny_params
from . import hosts
from .conftest import skip_without_second_hosts

pytestmark = pytest.mark.service

STEPS = 60                    # updates of every run; a checkpoint every 4 of them
LOST_TIMEOUT_S = 30           # TRAIN_DIST_TIMEOUT_S of the killed-rank test: a dead process is seen at once
SILENT_TIMEOUT_S = 10         # ... of the cut-off test: there, only the timeout can tell
MARGIN_S = 15                 # torchrun's own shutdown after its worker's exit, on two busy cores
SEED = 1
TRAIN = {**TINY["train"], "max_steps": STEPS, "checkpoint_every_steps": 4, "keep_checkpoints": STEPS // 4,
         "validate_every": STEPS, "log_every": 10, "seed": SEED}
PARAMS = tiny_params({"model": {"preset": "tiny", "dropout": 0.0},   # no dropout: no random bits per rank
                      "train": TRAIN})
_ports = itertools.count(29400)   # each host has its own network namespace: no other process uses its ports


@dataclass
class Workspace:
    """One host's copy of the workspace (its "disk") and the environment its processes get."""

    path: Path
    env: dict[str, str] = field(repr=False)

    def checkpoints(self) -> list[Path]:
        return list_checkpoints(self.path / "models" / "checkpoints")

    def resume_points(self) -> list[Path]:
        return [p for p in list_checkpoints(self.path / "models" / "checkpoints", resume_points=True)
                if p.name.endswith(".resume.pt")]

    def weights(self, step: int = STEPS) -> dict[str, torch.Tensor]:
        return load_checkpoint(self.path / "models" / "checkpoints" / f"checkpoint_{step:08d}.pt")["model"]


@dataclass
class Cluster:
    network: hosts.Network
    base: Workspace
    root: Path

    def workspace(self, name: str, train: dict | None = None, model: dict | None = None) -> Workspace:
        """A copy of the base workspace (code, params, token stores) for one host or run."""
        path = self.root / name
        shutil.copytree(self.base.path, path, symlinks=True)
        if train or model:
            params = yaml.safe_load((path / "params.yaml").read_text())
            params["train"].update(train or {})
            params["model"].update(model or {})
            (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        env = dict(self.base.env, PYTHONPATH=str(path), MLFLOW_TRACKING_URI=f"sqlite:///{path / 'mlflow.db'}")
        return Workspace(path, env)


def torchrun_argv(host: str, rendezvous_host: str, port: int, run_id: str) -> list[str]:
    """The command each host runs (docs/two_hosts.md shows it). ``is_host`` says which node serves
    the rendezvous store rather than leaving torchrun to guess from its hostname's addresses, and
    ``--local-addr`` is the name the other host reaches this one by (torch 2.13 also gives rank 0
    to the node whose address sorts first: host-a here)."""
    is_host = "true" if host == rendezvous_host else "false"
    return [str(BIN / "torchrun"), "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rendezvous_host}:{port}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={is_host},join_timeout=120,read_timeout=60", f"--local-addr={host}",
            "-m", "pipeline.stages.train"]


def stage_env(host: str, rendezvous_host: str, port: int, run_id: str) -> dict[str, str]:
    """The same rendezvous for the stage's own launcher (docs/two_hosts.md): ``python -m
    pipeline.stages.train`` (or ``dvc repro``) with these variables on each host."""
    is_host = "true" if host == rendezvous_host else "false"
    return {"PIPELINE_NNODES": "2", "PIPELINE_RDZV_ENDPOINT": f"{rendezvous_host}:{port}", "PIPELINE_RDZV_ID": run_id,
            "PIPELINE_RDZV_CONF": f"is_host={is_host},join_timeout=120,read_timeout=60", "PIPELINE_LOCAL_ADDR": host}


@dataclass
class TwoHostRun:
    """torchrun on host-a and host-b, each in its workspace, output to a log file per host."""

    agents: dict[str, subprocess.Popen]
    logs: dict[str, Path]
    started: float

    def worker(self, host: str) -> psutil.Process:
        """The training process torchrun started on ``host`` (a child of its agent)."""
        for child in psutil.Process(self.agents[host].pid).children():
            if "pipeline.stages.train" in " ".join(child.cmdline()):
                return child
        raise AssertionError(f"no training process under {host}'s torchrun")

    def wait(self, host: str, timeout: float) -> int:
        return self.agents[host].wait(timeout=timeout)

    def log(self, host: str) -> str:
        return self.logs[host].read_text(errors="replace")

    def stop(self) -> None:
        """SIGKILL what is left: each agent's own processes (found from its PID), then the agent."""
        for agent in self.agents.values():
            if agent.poll() is None:
                try:
                    children = psutil.Process(agent.pid).children(recursive=True)
                except psutil.NoSuchProcess:
                    children = []
                for child in children:
                    try:
                        child.kill()
                    except psutil.NoSuchProcess:
                        pass
                agent.kill()
            agent.wait(timeout=30)


def start_two_hosts(cluster: Cluster, spaces: dict[str, Workspace], timeout_s: float,
                    by_stage: bool = False) -> TwoHostRun:
    """torchrun on each host, or (``by_stage``) the stage launching its own process from ``PIPELINE_*``."""
    port = next(_ports)
    run_id = f"two-host-test-{port}"
    agents, logs = {}, {}
    started = time.monotonic()
    for name, space in spaces.items():
        logs[name] = space.path / f"torchrun-{port}.log"
        argv = ([sys.executable, "-m", "pipeline.stages.train"] if by_stage
                else torchrun_argv(name, "host-a", port, run_id))
        env = dict(space.env, TRAIN_DIST_TIMEOUT_S=str(timeout_s),
                   **(stage_env(name, "host-a", port, run_id) if by_stage else {}))
        with logs[name].open("w") as out:
            agents[name] = cluster.network.hosts[name].popen(argv, cwd=space.path, stdout=out,
                                                             stderr=subprocess.STDOUT, env=env)
    return TwoHostRun(agents, logs, started)


def run_two_hosts(cluster: Cluster, spaces: dict[str, Workspace], timeout_s: float = 120,
                  by_stage: bool = False) -> tuple[TwoHostRun, float]:
    """Both hosts to the end; their wall time. Once one torchrun fails the other gets 30 s, not
    the 300 s its agent may wait for the failed one at its exit barrier."""
    run = start_two_hosts(cluster, spaces, timeout_s, by_stage)
    deadline = time.monotonic() + 300
    try:
        while any(a.poll() is None for a in run.agents.values()) and time.monotonic() < deadline:
            if any(a.poll() for a in run.agents.values()):
                deadline = min(deadline, time.monotonic() + 30)
            time.sleep(0.05)
        elapsed = time.monotonic() - run.started
    finally:
        run.stop()
    for name, agent in run.agents.items():
        assert agent.returncode == 0, f"{name}: torchrun exited {agent.returncode}\n{run.log(name)[-4000:]}"
    return run, elapsed


def training_seconds(log: str) -> float:
    """The train stage's own figure: its training loop, without startup and rendezvous."""
    match = re.search(rf"trained {STEPS} steps in ([\d.]+) s", log)
    assert match, log[-3000:]
    return float(match.group(1))


def wait_for_checkpoint(space: Workspace, run: TwoHostRun, limit_s: float = 180) -> None:
    deadline = time.monotonic() + limit_s
    while not space.checkpoints():
        assert all(a.poll() is None for a in run.agents.values()), run.log("host-a")[-3000:] + run.log("host-b")[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint after {limit_s} s\n" + run.log("host-a")[-3000:]
        time.sleep(0.02)


def exited(process: psutil.Process, limit_s: float) -> bool:
    """Whether ``process`` (not this process's child) ended within ``limit_s``: gone, or a zombie
    its parent has not reaped (a torchrun agent blocked on its store reaps nothing)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name in got:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_second_hosts()
    root = tmp_path_factory.mktemp("two-hosts")
    path, env = make_workspace(root / "base", PARAMS)
    for stage in ("download", "tokenizer"):   # the token stores, made once and copied to every host
        made = subprocess.run([sys.executable, "-m", f"pipeline.stages.{stage}"], cwd=path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    with hosts.Network(("host-a", "host-b")) as network:
        yield Cluster(network, Workspace(path, env), root)


@pytest.fixture(scope="module")
def one_process(cluster: Cluster) -> tuple[Workspace, float, float]:
    """The reference: one process, the same data, two batches per update (the two hosts' pair)."""
    space = cluster.workspace("one-process", {"update_freq": 2, "max_tokens": TRAIN["max_tokens"] // 2})
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=space.path, env=space.env,
                          capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 process(es)" in done.stdout
    return space, elapsed, training_seconds(done.stdout)


def test_two_host_torchrun_equals_one_process(cluster: Cluster, one_process: tuple[Workspace, float, float]):
    spaces = {name: cluster.workspace(f"equal-{name}") for name in ("host-a", "host-b")}
    run, elapsed = run_two_hosts(cluster, spaces)
    log_a = run.log("host-a")
    assert "2 process(es)" in log_a, log_a[-3000:]
    assert not spaces["host-b"].checkpoints()   # rank 1 writes none: its host's disk holds no checkpoint
    single, single_elapsed, single_training = one_process

    final = spaces["host-a"].weights()
    assert_same_weights(final, single.weights())
    config = load_checkpoint(single.path / "models/checkpoints" / f"checkpoint_{STEPS:08d}.pt")["model_config"]
    torch.manual_seed(SEED)   # as the stage builds its model
    initial = Transformer(ModelConfig.from_dict(config)).state_dict()
    moved = [n for n in final if not torch.allclose(final[n], initial[n], atol=1e-4)]
    assert len(moved) > len(final) // 2, moved   # the updates really trained the model

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"\n{STEPS} updates, tiny preset, {os.cpu_count()} cores ({cpu}): two hosts (torchrun, gloo) "
          f"{training_seconds(log_a):.1f} s of training, {elapsed:.1f} s with startup and rendezvous; one process "
          f"{single_training:.1f} s of training, {single_elapsed:.1f} s in all")


def test_two_hosts_launched_by_the_stage_equal_one_process(cluster: Cluster,
                                                           one_process: tuple[Workspace, float, float]):
    """No torchrun: ``python -m pipeline.stages.train`` on each host (what ``dvc repro`` runs), the
    rendezvous from ``PIPELINE_*`` variables, ``train.processes`` 1 (one process per host)."""
    spaces = {name: cluster.workspace(f"stage-{name}") for name in ("host-a", "host-b")}
    run, _ = run_two_hosts(cluster, spaces, by_stage=True)
    assert "2 process(es) of 512 tokens per batch" in run.log("host-a"), run.log("host-a")[-3000:]
    assert not spaces["host-b"].checkpoints()
    assert_same_weights(spaces["host-a"].weights(), one_process[0].weights())


def test_two_host_lost_rank_stops_the_other_and_rerun_resumes(cluster: Cluster,
                                                              one_process: tuple[Workspace, float, float]):
    spaces = {name: cluster.workspace(f"lost-{name}") for name in ("host-a", "host-b")}
    run = start_two_hosts(cluster, spaces, LOST_TIMEOUT_S)
    try:
        wait_for_checkpoint(spaces["host-a"], run)
        victim = run.worker("host-b")
        killed = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        code_a = run.wait("host-a", timeout=LOST_TIMEOUT_S + MARGIN_S + 60)
        seen_after = time.monotonic() - killed
        code_b = run.wait("host-b", timeout=60)
    finally:
        run.stop()
    log_a = run.log("host-a")
    print(f"\nrank 1 SIGKILLed: host-a's torchrun exited {code_a} after {seen_after:.1f} s")
    assert code_a != 0 and code_b != 0, log_a[-3000:]
    assert seen_after < LOST_TIMEOUT_S + MARGIN_S, log_a[-3000:]
    error = next((line for line in log_a.splitlines() if line.startswith("error: ")), "")
    assert error.startswith("error: rank 0 of 2 lost rank 1 (its process or host stopped): "), log_a[-3000:]
    print(error)
    killed_at = int(re.search(r"(\d+)\.pt$", spaces["host-a"].checkpoints()[-1].name).group(1))
    assert 0 < killed_at < STEPS
    assert not spaces["host-b"].checkpoints()

    again, _ = run_two_hosts(cluster, spaces)
    assert f"resuming from step {killed_at} " in again.log("host-a"), again.log("host-a")[-3000:]
    # host-b has no checkpoint of its own: it resumes from the one host-a sent.
    assert f"resuming from step {killed_at} (epoch" in again.log("host-b"), again.log("host-b")[-3000:]
    assert f"from rank 0's checkpoint_{killed_at:08d}.pt" in again.log("host-b")
    assert_same_weights(spaces["host-a"].weights(), one_process[0].weights())


def test_two_host_silent_rank_times_out(cluster: Cluster):
    spaces = {name: cluster.workspace(f"silent-{name}") for name in ("host-a", "host-b")}
    run = start_two_hosts(cluster, spaces, SILENT_TIMEOUT_S)
    cut = ["ip", "-n", cluster.network.hosts["host-b"].namespace, "link", "set", "eth0"]
    try:
        wait_for_checkpoint(spaces["host-a"], run)
        worker_b = run.worker("host-b")
        subprocess.run([*cut, "down"], check=True)   # no packet gets through, nothing is closed
        cut_at = time.monotonic()
        code_a = run.wait("host-a", timeout=SILENT_TIMEOUT_S + MARGIN_S + 60)
        seen_after = time.monotonic() - cut_at
        # host-b's training process stops alike; its torchrun agent would wait on the rendezvous
        # store on host-a until TCP gives up (minutes): stop() kills it.
        assert exited(worker_b, SILENT_TIMEOUT_S + MARGIN_S), run.log("host-b")[-3000:]
    finally:
        subprocess.run([*cut, "up"], check=False)
        run.stop()
    log_a, log_b = run.log("host-a"), run.log("host-b")
    print(f"\nhost-b cut off: host-a's torchrun exited {code_a} after {seen_after:.1f} s "
          f"(TRAIN_DIST_TIMEOUT_S={SILENT_TIMEOUT_S})")
    assert code_a != 0, log_a[-3000:]
    assert SILENT_TIMEOUT_S - 1 <= seen_after < SILENT_TIMEOUT_S + MARGIN_S, log_a[-3000:]
    silent = f"(no answer for TRAIN_DIST_TIMEOUT_S={SILENT_TIMEOUT_S} s): "
    assert f"error: rank 0 of 2 lost rank 1 {silent}" in log_a, log_a[-3000:]
    assert f"error: rank 1 of 2 lost rank 0 {silent}" in log_b, log_b[-3000:]


STOP_STEPS = 32               # the stop test's updates (a checkpoint every 4): SIGTERM lands after the first
STOP_TRAIN = {"max_steps": STOP_STEPS, "keep_checkpoints": STOP_STEPS // 4, "validate_every": STOP_STEPS}


def test_two_host_sigterm_to_one_rank_stops_both_and_resumes_exactly(cluster: Cluster):
    """SIGTERM to host-b's training process only; dropout 0.1, so rank 1 must resume its own RNG."""
    def spaces(kind: str) -> dict[str, Workspace]:
        return {name: cluster.workspace(f"{kind}-{name}", STOP_TRAIN, {"dropout": 0.1})
                for name in ("host-a", "host-b")}

    straight = spaces("straight")
    run_two_hosts(cluster, straight)
    stopped = spaces("sigterm")
    run = start_two_hosts(cluster, stopped, LOST_TIMEOUT_S)
    try:
        wait_for_checkpoint(stopped["host-a"], run)
        run.worker("host-b").send_signal(signal.SIGTERM)
        codes = {name: run.wait(name, timeout=120) for name in ("host-a", "host-b")}
    finally:
        run.stop()
    logs = {name: run.log(name) for name in codes}
    steps = {name: re.findall(r"train: stopped by signal 15 after update (\d+);", log) for name, log in logs.items()}
    # Both ranks stopped gracefully after the same update (143: the stage's exit for SIGTERM; torchrun
    # reports its worker's failure), none was lost and none finished.
    for name in codes:
        assert codes[name] != 0 and len(steps[name]) == 1, f"{name}: exit {codes[name]}\n{logs[name][-3000:]}"
        assert "lost rank" not in logs[name] and "exitcode  : 143" in logs[name], logs[name][-3000:]
    step = int(steps["host-a"][0])
    assert steps["host-b"] == [str(step)] and 4 <= step < STOP_STEPS, (steps, logs["host-a"][-3000:])
    newest = list_checkpoints(stopped["host-a"].path / "models" / "checkpoints", resume_points=True)[-1]
    # One resume point, rank 0's (unless the stop fell on the checkpoint grid: that checkpoint holds it).
    expected = f"checkpoint_{step:08d}.pt" if step % 4 == 0 else f"checkpoint_{step:08d}.resume.pt"
    assert newest.name == expected and len(stopped["host-a"].resume_points()) == (step % 4 != 0), newest
    assert len(load_checkpoint(newest)["rng_ranks"]) == 2          # both ranks' generators in it
    assert not list_checkpoints(stopped["host-b"].path / "models" / "checkpoints", resume_points=True)

    again, _ = run_two_hosts(cluster, stopped)
    assert f"resuming from step {step} " in again.log("host-a"), again.log("host-a")[-3000:]
    assert f"resuming from step {step} (epoch" in again.log("host-b") and \
        f"from rank 0's {expected}" in again.log("host-b"), again.log("host-b")[-3000:]
    assert not stopped["host-a"].resume_points()   # replaced by the next checkpoint, as never written
    got, expected_weights = stopped["host-a"].weights(STOP_STEPS), straight["host-a"].weights(STOP_STEPS)
    assert got.keys() == expected_weights.keys()
    for name in got:
        assert torch.equal(got[name], expected_weights[name]), name
