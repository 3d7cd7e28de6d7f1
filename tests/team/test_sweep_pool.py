"""A sweep fanned out over two workers on two hosts, end to end against the stack.

The first machine (the root namespace) runs the stack on a bridge's address, serves the project's git
repository with ``git daemon``, makes the data stages and pushes them. A colleague's clone of the
repository runs ``python -m pipeline.workers.sweep --pool ...`` (``make sweep POOL=...``) on a 3-point
tiny grid (three averaging windows of one training); two workers (``python -m pipeline.workers start``,
one per host, ``--limit 1``, one thread each) take the points at once. The second worker is stopped in
the middle of a point's training and started again at once: it takes the point still waiting, the
stopped point's flow run crashes, no process of it is left, and the sweep command says so. The sweep
rerun: the two finished points are skipped (their experiments are on the repository) and the crashed one
resumes from its checkpoints on its own worker, ending with another point's checkpoints byte for byte
(every point trains the same updates; the others without a stop). Then every point is one run on the
tracking server with its overrides and the sweep's tag, none registered; ``compare --sweep`` ranks them;
``apply --sweep`` applies and registers the winner (its lineage on the model card); committed and
pushed, a clean clone's ``dvc pull`` has its outputs and ``dvc status`` is clean.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .conftest import PYTHON, server_client, skip_without_second_hosts
from .sweep_team import SweepTeam, Worker, sweep_team
from .test_two_machines import Machine
from .test_worker import descendants, stop

pytestmark = pytest.mark.service

EXPERIMENT, MODEL, SWEEP = "sweep-pool-test", "sweep-translator", "grid"
HOSTS = ("sweep-a", "sweep-b")
# Enough updates that the stop lands between two checkpoints of the point (a few seconds of the tiny preset).
TRAIN = {"max_epochs": 0, "max_steps": 100, "checkpoint_every_steps": 20, "validate_every": 50, "log_every": 20,
         "keep_checkpoints": 4}
# One training, three averaging windows, none the params' own (3), so that the winner changes params.yaml:
# every point's checkpoints are the same bytes, stopped or not.
GRID = {"average.last_n": [1, 2, 4]}
CRASH_GRACE_S = 10
SWEEP_TIMEOUT_S = 600
HERE = Path(__file__).resolve().parent


def prefect(team: SweepTeam, *args: str, timeout: float = 60) -> object:
    result = subprocess.run([PYTHON, str(HERE / "prefect_runs.py"), *args], env=team.colleague.env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[SweepTeam]:
    skip_without_second_hosts()
    with sweep_team(tmp_path_factory.mktemp("sweep-pool"), HOSTS, GRID, TRAIN,
                    {"experiment": EXPERIMENT, "registered_model": MODEL}) as team:
        yield team


def wait_for_checkpoint(worker: Worker, timeout: float = SWEEP_TIMEOUT_S) -> None:
    checkpoints = worker.workspace / "models" / "checkpoints"
    deadline = time.monotonic() + timeout
    while not list(checkpoints.glob("*.pt")):
        assert time.monotonic() < deadline and worker.process.poll() is None, worker.output()[-3000:]
        time.sleep(0.1)


@pytest.fixture(scope="module")
def swept(pool: SweepTeam) -> dict[str, str]:
    """The sweep on two workers, the second stopped mid-point; restarted and the sweep rerun."""
    for name in HOSTS:
        pool.start_worker(name)
    first_log = pool.tmp / "sweep-1.log"
    started = time.monotonic()
    sweep = pool.sweep(SWEEP, first_log, "--crash-grace", str(CRASH_GRACE_S))
    try:
        stopped = pool.workers["sweep-b"].process
        wait_for_checkpoint(pool.workers["sweep-b"])
        started_there = descendants(stopped.pid)   # the flow run, DVC and the train stage
        # A service manager's stop: the worker SIGKILLs its flow run; the heartbeat automation crashes it.
        stopped.send_signal(signal.SIGINT)
        stopped.wait(timeout=120)
        deadline = time.monotonic() + 60
        while (left := [pid for pid in started_there if Path(f"/proc/{pid}").exists()]) \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        # Back at once (the same host and workspace): it takes a point still waiting while the
        # crashed one's heartbeat runs out, and the crashed one only when the sweep is rerun.
        pool.start_worker("sweep-b")
        first_code = sweep.wait(timeout=SWEEP_TIMEOUT_S)
    finally:
        stop(sweep)
    first = first_log.read_text()
    second_log = pool.tmp / "sweep-2.log"
    rerun = pool.sweep(SWEEP, second_log, "--crash-grace", str(CRASH_GRACE_S))
    try:
        second_code = rerun.wait(timeout=SWEEP_TIMEOUT_S)
    finally:
        stop(rerun)
    second = second_log.read_text()
    print(f"the sweep, its crash and its rerun: {time.monotonic() - started:.0f} s")
    assert not left, "processes of the stopped point's flow run were still running a minute later"
    assert first_code == 1, first
    assert second_code == 0, second + "\n" + pool.workers["sweep-b"].output()[-3000:]
    return {"first": first, "second": second}


def test_a_worker_stopped_mid_point_crashes_it_and_the_rerun_resumes_only_that_point(pool, swept):
    first, second = swept["first"], swept["second"]
    assert "CRASHED" in first and "2 of 3 point(s) finished" in first, first
    assert "rerun `make sweep POOL=sweep-pool SWEEP=grid`" in first
    lines = [line for line in second.splitlines() if line.startswith("  point ")]
    planned = [line for line in lines if ": finished (" in line or ": resume on " in line or ": submit (" in line]
    assert sum(": finished (" in line for line in planned) == 2, second
    resumed = [line for line in planned if ": resume on on-sweep-b" in line]
    assert len(resumed) == 1 and not any(": submit (" in line for line in planned), second
    point = int(resumed[0].split()[1])
    runs = prefect(pool, "sweep-runs", SWEEP)
    newest = runs[str(point)]
    assert newest["state"] == "COMPLETED" and "worker-queue:on-sweep-b" in newest["tags"], newest
    logs = "\n".join(prefect(pool, "logs", newest["id"]))
    assert "resuming from step" in logs, logs[-3000:]
    # Another point trained the same updates without a stop: the resumed training's kept checkpoints
    # are that point's, byte for byte (one DVC hash).
    twin = (point + 1) % len(GRID["average.last_n"])
    assert checkpoints_hash(pool, point) == checkpoints_hash(pool, twin)


def checkpoints_hash(pool: SweepTeam, point: int) -> str:
    """The md5 of ``models/checkpoints`` in the ``dvc.lock`` of the point's pushed experiment."""
    git = ["git", f"--git-dir={pool.tmp / 'git' / 'translator.git'}"]
    refs = subprocess.run([*git, "for-each-ref", "--format=%(refname)", "refs/exps"], capture_output=True,
                          text=True, check=True).stdout.split()
    (ref,) = [r for r in refs if r.endswith(f"/{SWEEP}-p{point}")]
    lock = yaml.safe_load(subprocess.run([*git, "show", f"{ref}:dvc.lock"], capture_output=True, text=True,
                                         check=True).stdout)
    (out,) = [o for o in lock["stages"]["train"]["outs"] if o["path"] == "models/checkpoints"]
    return out["md5"]


def test_every_point_is_one_run_on_the_server_tagged_with_its_overrides_and_none_registered(pool, swept,
                                                                                          monkeypatch):
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, pool.colleague.env[key])
    client = server_client(pool.colleague.env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.sweep = '{SWEEP}'")
    assert sorted(int(r.data.tags["sweep.point"]) for r in runs) == [0, 1, 2]
    values = [{"average.last_n": n} for n in GRID["average.last_n"]]
    for run in runs:
        point = int(run.data.tags["sweep.point"])
        assert run.info.status == "FINISHED" and "valid_bleu" in run.data.metrics
        assert json.loads(run.data.tags["sweep.overrides"]) == values[point]
        assert int(run.data.params["average.last_n"]) == values[point]["average.last_n"]
        assert run.data.tags["sweep.experiment"] == f"{SWEEP}-p{point}"
        assert run.data.tags["git.commit"] == pool.commit
    # Both workers ran points at once: some two runs overlap in time.
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans
    assert client.search_model_versions(f"name = '{MODEL}'") == []


def test_compare_ranks_the_sweep_and_apply_brings_the_winner_to_a_clean_clone(pool, swept, monkeypatch):
    colleague = pool.colleague
    compared = colleague.run(PYTHON, "-m", "pipeline.experiments.compare", "--sweep", SWEEP)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    table = [[cell.strip() for cell in line.split("|")[1:-1]] for line in compared.stdout.splitlines()
             if line.startswith("|")]
    header, rows = table[0], table[2:]
    assert len(rows) == 3 and "point" in header and "val-chosen beam_size" in header, compared.stdout
    scores = [float(row[header.index("valid_bleu (ranks)")]) for row in rows]
    assert scores == sorted(scores, reverse=True), compared.stdout
    assert sorted(int(row[header.index("point")]) for row in rows) == [0, 1, 2]

    applied = colleague.run(PYTHON, "-m", "pipeline.experiments.apply", "--sweep", SWEEP)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "now commit it" in applied.stdout and "git add params.yaml dvc.lock" in applied.stdout, applied.stdout
    winner_point = int(applied.stdout.split("winner of sweep grid: point ")[1].split()[0])
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(key, colleague.env[key])
    client = server_client(colleague.env["MLFLOW_TRACKING_URI"])
    (version,) = client.search_model_versions(f"name = '{MODEL}'")
    assert version.tags["sweep"] == SWEEP and version.tags["sweep.point"] == str(winner_point)
    assert f"Chosen by the sweep `{SWEEP}`" in version.description
    assert float(scores[0]) == pytest.approx(client.get_run(version.run_id).data.metrics["valid_bleu"], abs=0.01)

    assert colleague.run("git", "add", "params.yaml", "dvc.lock").returncode == 0
    assert colleague.run("git", "commit", "-qm", "sweep grid's winner").returncode == 0
    pushed = colleague.run("git", "push", "-q", "origin", "HEAD:refs/heads/sweep-winner")
    assert pushed.returncode == 0, pushed.stderr
    clean = pool.tmp / "clean"
    subprocess.run(["git", "clone", "-q", "--branch", "sweep-winner", pool.repository, str(clean)], check=True)
    machine = Machine(clean, {**colleague.env, "PYTHONPATH": str(clean)})
    assert machine.run(PYTHON, "-m", "pipeline.stack", "remote").returncode == 0
    pulled = machine.dvc("pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    status = machine.dvc("status")
    assert "Data and pipelines are up to date" in status.stdout, status.stdout
    assert (clean / "models" / "model.pt").read_bytes() == (colleague.path / "models" / "model.pt").read_bytes()
