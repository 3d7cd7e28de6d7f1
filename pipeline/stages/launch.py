"""Several training processes inside the train stage, started by PyTorch's elastic launcher
through its Python API (``LaunchConfig`` + ``elastic_launch``, what ``torchrun`` runs), so that
``dvc repro``, the flows and the workers train on every GPU of a machine (§5.2: "one machine
with 8 NVIDIA P100 GPUs"), or of several.

``train.processes`` (params.yaml) is how many processes this host starts: a number, or ``auto``
for one per visible GPU (one where no GPU is visible or ``train.device`` is cpu). With 1 on one
host nothing is launched: the stage trains in its own process, as it always did. Under an outer
launcher (``torchrun -m pipeline.stages.train``: ``LOCAL_RANK`` is set) the stage trains as the
rank it was started as and launches nothing.

Several hosts: the rendezvous comes from the environment, so params.yaml (a DVC dependency) is the
same on every host (docs/two_hosts.md):

- ``PIPELINE_NNODES``: the number of hosts (default 1).
- ``PIPELINE_RDZV_ENDPOINT``: ``host:port`` of the c10d rendezvous, the same on every host
  (needed with several hosts; one host alone uses a free port of 127.0.0.1).
- ``PIPELINE_RDZV_ID``: the job's id, the same on every host (default ``pipeline-train``).
- ``PIPELINE_RDZV_CONF``: more rendezvous settings, ``key=value,...`` (``is_host=true,join_timeout=120``);
  with several hosts ``is_host`` is required: ``true`` on the host that serves the rendezvous.
- ``PIPELINE_LOCAL_ADDR``: this host's address as the other hosts reach it (one host: 127.0.0.1).

The rendezvous's stores listen on one address each (``bound_rendezvous``): 127.0.0.1 on one host,
where gloo is kept on loopback too (``GLOO_SOCKET_IFNAME=lo`` unless set), so a training on one
host opens nothing to the network.
- ``PIPELINE_MAX_RESTARTS``: how often the launcher restarts every process after one failed
  (default 0). A failed process fails the stage instead: its rerun (by hand, by a flow's task
  retries, by a worker) resumes from the newest checkpoint, as a restart would, and a failure that
  repeats (bad data, out of memory) is not tried again behind the team's back.

They are environment variables, not params.yaml keys, because they change nothing in what is
trained (as ``TRAIN_DIST_TIMEOUT_S``); ``train.processes`` is a key because it does (below).

The processes die with the stage: a SIGTERM or SIGINT to the stage (DVC's, a flow's, a
scheduler's) is forwarded by the launcher to every process, which stop together after the same
update with a resume checkpoint (``transformer.training.stopping``); the launcher waits for them (up to
``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, 30 s by default, then SIGKILL) and the stage exits 128 + the
signal's number, so DVC never records a stopped training as done. A stage killed outright
(SIGKILL) reaches them through ``PR_SET_PDEATHSIG`` (``parent_death``): each process gets SIGTERM
and stops the same way.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass, field

from pipeline.config.errors import ParamsError
from transformer.training.train_config import TrainConfig

LAUNCHER_PID_ENV = "PIPELINE_LAUNCHER_PID"   # set for the processes this module starts
DEFAULT_RDZV_ID = "pipeline-train"
DEFAULT_MAX_RESTARTS = 0
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Rendezvous:
    """Where this host's launcher meets the others' (c10d): read from ``PIPELINE_*`` variables."""

    nnodes: int = 1
    endpoint: str = f"{LOOPBACK}:0"   # one host: the stores on a free port of loopback
    run_id: str = ""
    conf: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Rendezvous:
        """The rendezvous the environment describes; ``ParamsError`` (one line naming the
        variable) for a bad value."""
        env = dict(os.environ if env is None else env)
        nnodes = _count(env, "PIPELINE_NNODES", 1, minimum=1)
        endpoint = env.get("PIPELINE_RDZV_ENDPOINT", "").strip()
        if nnodes > 1 and not endpoint:
            raise ParamsError(f"PIPELINE_NNODES={nnodes} needs PIPELINE_RDZV_ENDPOINT (host:port of the rendezvous, "
                              "the same on every host)")
        conf: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in env.get("PIPELINE_RDZV_CONF", "").split(","))):
            key, sep, value = item.partition("=")
            if not (sep and key.strip()):
                raise ParamsError(f"PIPELINE_RDZV_CONF={env['PIPELINE_RDZV_CONF']!r}: expected key=value,...")
            conf[key.strip()] = value.strip()
        if nnodes > 1 and conf.get("is_host", "").lower() not in {"true", "false", "1", "0", "yes", "no"}:
            raise ParamsError(f"PIPELINE_NNODES={nnodes} needs is_host in PIPELINE_RDZV_CONF: is_host=true on the "
                              "host that serves the rendezvous, is_host=false on the others")
        if nnodes == 1:
            conf.setdefault("is_host", "true")   # the store is this host's own
        # One host: a fresh id per run (its store is its own). Several: the same id on every host.
        run_id = env.get("PIPELINE_RDZV_ID", "").strip() or (DEFAULT_RDZV_ID if nnodes > 1 else uuid.uuid4().hex)
        local_addr = env.get("PIPELINE_LOCAL_ADDR", "").strip() or (LOOPBACK if nnodes == 1 else None)
        return cls(nnodes=nnodes, endpoint=endpoint or cls.endpoint, run_id=run_id, conf=conf, local_addr=local_addr,
                   max_restarts=_count(env, "PIPELINE_MAX_RESTARTS", DEFAULT_MAX_RESTARTS, minimum=0))

    @property
    def loopback_only(self) -> bool:
        """Everything of this rendezvous is on this host's loopback (one host, no address given)."""
        return self.nnodes == 1 and self.endpoint.startswith(f"{LOOPBACK}:") and self.local_addr == LOOPBACK


def _count(env: dict[str, str], name: str, default: int, minimum: int) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < minimum:
        raise ParamsError(f"{name}={text!r}: expected an integer of at least {minimum}")
    return int(text)


def under_launcher() -> bool:
    """This process was started by a launcher (``torchrun``, or this module): it trains as a rank."""
    return "LOCAL_RANK" in os.environ


def processes_to_start(requested: int | str, device: str) -> int:
    """``train.processes`` on this host: ``auto`` is one process per visible GPU (one without a
    GPU, or with ``train.device`` cpu); more processes than GPUs when training on them is refused."""
    import torch

    gpus = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
    processes = max(1, gpus) if requested == "auto" else int(requested)
    if gpus and processes > gpus:
        raise ParamsError(f"params.yaml: train.processes is {processes} but {gpus} GPU(s) are visible: "
                          "one process per GPU (set train.processes to auto, or train.device to cpu)")
    return processes


def launch(processes: int, rendezvous: Rendezvous, module: str) -> int:
    """Run ``python -m module`` in ``processes`` processes on this host (and, with the others'
    launchers, on every host) until they end; returns the stage's exit code."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from pipeline.stages import bound_rendezvous

    if processes > 1 and "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does, without its one thread each: the host's cores shared out (CPU training).
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    if rendezvous.loopback_only and sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # gloo listens on its hostname's address otherwise
    bound_rendezvous.register()
    # Our own folder for the launcher's error files, removed after (DefaultLogsSpecs' own stays in /tmp).
    with tempfile.TemporaryDirectory(prefix="train-launch-") as logs:
        config = LaunchConfig(
            min_nodes=rendezvous.nnodes, max_nodes=rendezvous.nnodes, nproc_per_node=processes,
            run_id=rendezvous.run_id, rdzv_backend=bound_rendezvous.BACKEND, rdzv_endpoint=rendezvous.endpoint,
            rdzv_configs=dict(rendezvous.conf), max_restarts=rendezvous.max_restarts, start_method="spawn",
            local_addr=rendezvous.local_addr, logs_specs=DefaultLogsSpecs(log_dir=logs))
        try:
            elastic_launch(config, sys.executable)("-m", module)
        except SignalException as err:
            # The processes got the signal too and stopped at a resume checkpoint; a rerun resumes.
            print(f"train: stopped by {err.sigval.name}; the processes saved a resume checkpoint, "
                  "a rerun resumes from it", file=sys.stderr, flush=True)
            return 128 + int(err.sigval)
        except ChildFailedError as err:
            rank, failure = err.get_first_failure()
            code = failure.exitcode
            how = f"exit code {code}" if code > 0 else f"signal {-code}"
            print(f"train: the process of rank {rank} ended with {how} (its message is above)",
                  file=sys.stderr, flush=True)
            return code if code > 0 else 128 - code
    return 0


def exit_if_launcher_gone() -> None:
    """In a process this module started: exit if the stage that launched it is already gone (it
    died before ``parent_death`` could ask the kernel to signal its end: nobody would stop this
    process). ``run_stage`` has made that request by now, so this closes the gap."""
    pid = os.environ.get(LAUNCHER_PID_ENV, "")
    if not (pid.isdigit() and under_launcher()):
        return
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError):   # PermissionError: someone else's process, the pid reused
        sys.exit(f"train: the stage that launched this process (pid {pid}) is gone")


def per_process(config: TrainConfig, world_size: int) -> TrainConfig:
    """``train.max_tokens`` counts the padded tokens of one batch in all processes together, an
    update being ``update_freq`` such batches (§5.1: batches of about 25000 source and 25000 target
    tokens, §5.2: on 8 GPUs), so the tokens per update, and with them the learning rate's schedule
    and the model, do not depend on the number of GPUs: each
    process's batches hold at most ``max_tokens // world_size``, rounded down (an update holds at
    most ``max_tokens``, and a recipe's number need not divide by every GPU count ``auto`` may find).

    ``world_size`` processes then train exactly as one process with ``max_tokens // world_size``
    and ``update_freq * world_size`` (rank r takes every world_size-th batch of the same list:
    ``TokenBatchSampler``), within float tolerance and with dropout 0 (each rank draws its own bits).
    """
    if world_size == 1:
        return config
    share = config.max_tokens // world_size
    if share < 1:
        raise ParamsError(f"params.yaml: train.max_tokens is {config.max_tokens}, less than one token for each of "
                          f"{world_size} processes: raise train.max_tokens or lower train.processes")
    return dataclasses.replace(config, max_tokens=share)
