"""The object store on a nearly full disk. ``weed mini`` (the store before) refused every write with
less than 1% of its disk free, a fixed rule, while its health check passed: on a large shared disk
with a few GB left, every push failed. ``weed server`` with the stack's own floor
(``MIN_FREE_SPACE``, 256 MiB) takes writes with 800 MB free of 100 GB (0.8%), and ``make stack``
warns when the disk is near the floor. The disk is a sparse ext4 image on a loop device: a few MB
of real disk, filled with ``fallocate`` (no data written)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.stack.objectstore import BUCKETS, MIN_FREE_BYTES, ObjectStore
from pipeline.stack.secrets import load_or_create
from pipeline.stack.settings import StackSettings

from .conftest import free_port_base

pytestmark = pytest.mark.service

DISK_BYTES = 100 * 2**30


def loop_devices_missing() -> str:
    if os.geteuid() != 0:
        return "a loop-mounted file system needs root"
    missing = [p for p in ("mkfs.ext4", "mount", "umount", "fallocate") if shutil.which(p) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    if not Path("/dev/loop-control").exists():
        return "no loop devices on this machine (/dev/loop-control)"
    return ""


@contextmanager
def nearly_full_disk(image: Path, mount_point: Path) -> Iterator[Path]:
    """A 100 GB ext4 file system (sparse image, no journal, few inodes: a few MB on the real disk)."""
    reason = loop_devices_missing()
    if reason:
        pytest.skip(reason)
    with open(image, "wb") as sparse:
        sparse.truncate(DISK_BYTES)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-N", "4096", "-O", "^has_journal",
                    "-E", "lazy_itable_init=1,nodiscard", str(image)], check=True, capture_output=True)
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill_to(mount_point: Path, free_bytes: int) -> None:
    """Allocate (not write) all but ``free_bytes`` of the file system."""
    filler = mount_point / "filler"
    have = filler.stat().st_size if filler.exists() else 0
    subprocess.run(["fallocate", "-l", str(have + shutil.disk_usage(mount_point).free - free_bytes), str(filler)],
                   check=True)


def test_the_store_takes_writes_with_under_one_percent_of_its_disk_free_and_warns_near_its_floor(
        tmp_path, capsys):
    with nearly_full_disk(tmp_path / "disk.img", tmp_path / "disk") as disk:
        settings = StackSettings(directory=disk / "stack", host="127.0.0.1", port_base=free_port_base())
        store = ObjectStore(settings, load_or_create(settings.path("secrets")))
        fill_to(disk, 800 * 2**20)
        assert shutil.disk_usage(disk).free / DISK_BYTES < 0.01
        store.start()
        try:
            s3 = store.client()
            body = os.urandom(2 * 2**20)
            for bucket in BUCKETS:   # each bucket is a collection of its own: each grows its own volume
                s3.put_object(Bucket=bucket, Key="near-full/object", Body=body)
                assert s3.get_object(Bucket=bucket, Key="near-full/object")["Body"].read() == body
        finally:
            store.stop()
        assert "warning" not in capsys.readouterr().out

        fill_to(disk, MIN_FREE_BYTES + 64 * 2**20)   # near the floor: the start says so
        store.start()
        try:
            assert store.client().get_object(Bucket=BUCKETS[0], Key="near-full/object")["Body"].read() == body
        finally:
            store.stop()
        said = capsys.readouterr().out
        assert f"warning: the S3 store's disk ({settings.path('s3', 'data')}) has 320 MiB free" in said, said
        assert "takes no more writes (reads go on)" in said
