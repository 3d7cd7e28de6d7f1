"""pipeline/stages/launch.py: ``train.processes`` makes the train stage start its processes with
PyTorch's elastic launcher inside ``dvc repro`` (gloo on CPU here): two processes train the model
of one process with the same tokens per update (§5.2's batches); the processes die with the stage
(SIGTERM forwarded, SIGKILL through the parent-death signal), each time with a resume checkpoint;
bad values stop with one line and exit 2."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from pipeline.config.errors import ParamsError
from pipeline.stages.launch import Rendezvous, per_process, processes_to_start
from transformer.training.train_config import TrainConfig

from ..conftest import TINY, Workspace, make_workspace, needs_mirror, tiny_params

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[3]
STEPS = 24
# Dropout 0: the ranks draw other random bits than one process would
# (tests/transformer/training/test_trainer_distributed.py).
LAUNCH = {"model": {"preset": "tiny", "dropout": 0.0},
          "train": {**TINY["train"], "max_steps": STEPS, "max_tokens": 1024, "update_freq": 1,
                    "checkpoint_every_steps": 8, "keep_checkpoints": 3, "log_every": 8, "validate_every": STEPS,
                    "processes": 2}}


# ------------------------------------------------------------------------- settings, no process


def test_rendezvous_from_the_environment():
    one = Rendezvous.from_env({})
    assert (one.nnodes, one.endpoint, one.max_restarts, one.conf, one.local_addr) == (
        1, "127.0.0.1:0", 0, {"is_host": "true"}, "127.0.0.1")
    assert one.loopback_only
    assert one.run_id != Rendezvous.from_env({}).run_id   # one host: a fresh rendezvous per run
    two = Rendezvous.from_env({"PIPELINE_NNODES": "2", "PIPELINE_RDZV_ENDPOINT": "host-a:29400",
                               "PIPELINE_RDZV_CONF": "is_host=true, join_timeout=120",
                               "PIPELINE_LOCAL_ADDR": "host-a", "PIPELINE_MAX_RESTARTS": "3"})
    assert (two.nnodes, two.endpoint, two.run_id, two.local_addr, two.max_restarts) == (
        2, "host-a:29400", "pipeline-train", "host-a", 3)
    assert two.conf == {"is_host": "true", "join_timeout": "120"}
    # One host with an endpoint of its own choosing: it still serves the store itself.
    own = Rendezvous.from_env({"PIPELINE_RDZV_ENDPOINT": "127.0.0.1:29511"})
    assert (own.endpoint, own.conf, own.local_addr) == ("127.0.0.1:29511", {"is_host": "true"}, "127.0.0.1")


@pytest.mark.parametrize("env, message", [
    ({"PIPELINE_NNODES": "0"}, "PIPELINE_NNODES='0': expected an integer of at least 1"),
    ({"PIPELINE_NNODES": "two"}, "PIPELINE_NNODES='two': expected an integer of at least 1"),
    ({"PIPELINE_NNODES": "2"}, "PIPELINE_NNODES=2 needs PIPELINE_RDZV_ENDPOINT"),
    ({"PIPELINE_NNODES": "2", "PIPELINE_RDZV_ENDPOINT": "host-a:29400"}, "PIPELINE_NNODES=2 needs is_host in"),
    ({"PIPELINE_MAX_RESTARTS": "-1"}, "PIPELINE_MAX_RESTARTS='-1': expected an integer of at least 0"),
    ({"PIPELINE_RDZV_CONF": "is_host"}, "PIPELINE_RDZV_CONF='is_host': expected key=value"),
])
def test_bad_rendezvous_settings_name_the_variable(env, message):
    with pytest.raises(ParamsError, match=message):
        Rendezvous.from_env(env)


def test_max_tokens_is_shared_out_among_the_processes():
    config = TrainConfig(max_tokens=1024, max_steps=1)
    assert per_process(config, 1) is config   # one process: the very config, nothing changes
    assert per_process(config, 2).max_tokens == 512
    assert per_process(config, 3).max_tokens == 341   # rounded down: an update holds at most max_tokens
    assert per_process(config, 2).update_freq == config.update_freq
    with pytest.raises(ParamsError, match="train.max_tokens is 1024, less than one token for each of 2048 processes"):
        per_process(config, 2048)


def test_processes_on_a_machine_without_gpus():
    if torch.cuda.is_available():
        pytest.skip("counts GPUs: this machine has some")
    assert processes_to_start("auto", "auto") == 1   # one per visible GPU, and one without any
    assert processes_to_start(3, "cpu") == 3


# ------------------------------------------------------------------------- the stage


@pytest.mark.pipeline
@pytest.mark.parametrize("value, shown", [(0, "0"), ("all", "'all'"), (True, "True"), (1.5, "1.5")])
def test_bad_processes_value_is_one_line_and_exit_2(tmp_path, value, shown):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["processes"] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pipeline.stages.train"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == f"error: params.yaml: train.processes must be a positive integer or auto, got {shown}"
    assert not (tmp_path / "models").exists()


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace whose download and tokenizer stages ran (300 Multi30k pairs), tracking off."""
    path, env = make_workspace(tmp_path_factory.mktemp("launch") / "repo", tiny_params(LAUNCH))
    env.update(PIPELINE_TRACKING="off")
    ws = Workspace(path, env, None)  # type: ignore[arg-type]
    ws.first_run = ws.dvc("repro", "tokenizer", timeout=600)
    assert ws.first_run.returncode == 0, ws.first_run.stdout[-3000:] + ws.first_run.stderr[-3000:]
    return ws


def copy_with(ws: Workspace, dest: Path, **train: object) -> Workspace:
    """A copy of ``ws`` (git, DVC cache, token stores) with these ``train`` keys."""
    shutil.copytree(ws.path, dest, symlinks=True)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["train"].update(train)
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return Workspace(dest, {**ws.env, "PYTHONPATH": str(dest)}, ws.first_run)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@needs_mirror
@pytest.mark.pipeline
@pytest.mark.training
def test_two_processes_in_dvc_repro_equal_one_process(tokenized, tmp_path):
    """``dvc repro average`` with ``train.processes: 2`` (1024 tokens per batch in all processes:
    512 each) against one process taking two batches of 512 per update: the same checkpoints and
    averaged model, within fp32 tolerance."""
    two = copy_with(tokenized, tmp_path / "two")
    one = copy_with(tokenized, tmp_path / "one", processes=1, max_tokens=512, update_freq=2)
    for ws, shown in ((two, "2 process(es) of 512 tokens per batch"), (one, "1 process(es)\n")):
        done = ws.dvc("repro", "average", timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert shown in done.stdout, done.stdout[-3000:]
    steps = [line.split(",")[0] for line in (two.path / "reports/train_curve.csv").read_text().splitlines()]
    assert steps == [line.split(",")[0] for line in (one.path / "reports/train_curve.csv").read_text().splitlines()]
    ckpt = f"models/checkpoints/checkpoint_{STEPS:08d}.pt"
    for name in (ckpt, "models/model.pt"):
        a, b = weights(two.path / name), weights(one.path / name)
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
    status = two.dvc("status", "train")
    assert "up to date" in status.stdout, status.stdout   # DVC recorded the stage: it never left DVC


@needs_mirror
@pytest.mark.pipeline
def test_a_failed_process_fails_the_stage_with_its_code(tokenized, tmp_path):
    """A rank's own error (here ``train.device`` cuda without a GPU, which only a rank's trainer
    checks) ends the stage with that rank's exit code, 2, and its line."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    ws = copy_with(tokenized, tmp_path / "ws", device="cuda", precision="fp32")
    done = ws.run(sys.executable, "-m", "pipeline.stages.train", timeout=300)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "error: params.yaml: train.device is cuda but no GPU is visible" in done.stderr, done.stderr[-3000:]
    assert "train: the process of rank " in done.stderr and "ended with exit code 2" in done.stderr


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def listening(pids: list[int]) -> dict[tuple[str, int], int]:
    """Every listening TCP socket (address, port) of these processes, and whose it is."""
    doors = {}
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                doors[(conn.laddr.ip, conn.laddr.port)] = pid
    return doors


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_mirror
@pytest.mark.pipeline
@pytest.mark.training
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_processes_die_with_the_stage(tokenized, tmp_path, sig):
    """The stage as DVC runs it, two processes, killed once they train: SIGTERM is forwarded to
    both (the stage exits 143), SIGKILL reaches them through the parent-death signal; either way
    they stop together and leave a resume checkpoint. While they train, nothing of theirs listens
    off loopback (torch's c10d stores listened on every interface: ``bound_rendezvous``)."""
    ws = copy_with(tokenized, tmp_path / "ws", max_steps=100000, checkpoint_every_steps=4)
    ckpts = ws.path / "models" / "checkpoints"
    log = tmp_path / "stage.log"
    with open(log, "w") as out:   # a file, not a pipe nobody reads while the processes write
        stage = subprocess.Popen([sys.executable, "-m", "pipeline.stages.train"], cwd=ws.path, env=ws.env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not list(ckpts.glob("checkpoint_*.pt")):
            assert stage.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        workers = children(stage.pid)
        assert len(workers) == 2, workers
        doors = listening([stage.pid, *workers])
        # The rendezvous's two stores (the launcher's) and gloo's (the workers'), loopback all.
        assert sum(pid == stage.pid for pid in doors.values()) == 2, doors
        assert all(ip == "127.0.0.1" for ip, _ in doors), doors
        stage.send_signal(sig)
        code = stage.wait(timeout=90)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(alive(p) for p in workers), "a training process outlived the stage"
    finally:
        if stage.poll() is None:
            stage.kill()
    output = log.read_text()
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL), output[-3000:]
    # Both processes stopped after the same update; its resume point holds it (a stop on the checkpoint
    # grid leaves none: that update's checkpoint holds the state).
    stops = {int(line.rsplit("after update ", 1)[1].split(";")[0]) for line in output.splitlines()
             if line.startswith("train: stopped by signal 15 after update ")}
    assert len(stops) == 1, output[-3000:]
    step = stops.pop()
    name = f"checkpoint_{step:08d}.pt" if step % 4 == 0 else f"checkpoint_{step:08d}.resume.pt"
    assert (ckpts / name).is_file(), (name, sorted(p.name for p in ckpts.iterdir()), output[-3000:])
