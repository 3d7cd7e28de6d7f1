"""transformer/atomic.py: writes land whole or not at all, with the mode open()/mkdir() would give."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from transformer.atomic import atomic_dir, atomic_write, dir_sha256, file_sha256, write_json, write_lines, write_text

pytestmark = pytest.mark.fast


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_and_folders_follow_the_umask(tmp_path, umask_027):
    write_text(tmp_path / "a.txt", "x")
    atomic_write(tmp_path / "b.bin", lambda f: f.write(b"\0"))
    with atomic_dir(tmp_path / "folder") as tmp:
        (tmp / "inside").write_text("y")
    assert mode(tmp_path / "a.txt") == mode(tmp_path / "b.bin") == 0o640
    assert mode(tmp_path / "folder") == 0o750
    os.umask(0o022)
    write_json(tmp_path / "c.json", {"b": 1, "a": 2})
    assert mode(tmp_path / "c.json") == 0o644
    assert (tmp_path / "c.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.txt"
    write_text(target, "old")

    def fail(lines):
        yield "new"
        raise RuntimeError("cut short")

    with pytest.raises(RuntimeError):
        write_lines(target, fail(None))
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]


def test_a_failed_folder_leaves_the_old_folder(tmp_path):
    with atomic_dir(tmp_path / "store") as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(ValueError):
        with atomic_dir(tmp_path / "store") as tmp:
            (tmp / "v").write_text("2")
            raise ValueError("bad data")
    assert (tmp_path / "store" / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


def test_hashes(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "x").write_bytes(b"abc")
    (tmp_path / "d" / "sub" / "y").write_bytes(b"")
    assert file_sha256(tmp_path / "d" / "x", chunk_bytes=2) == hashlib.sha256(b"abc").hexdigest()
    first = dir_sha256(tmp_path / "d")
    (tmp_path / "d" / "sub" / "y").write_bytes(b"!")
    assert dir_sha256(tmp_path / "d") != first
