"""A safetensors file is given its final size before its blocks arrive (``writer._reserve``):
its blocks are reserved where the file system does that without writing them, and not on
tmpfs, where reserving means allocating and zeroing the file's memory before the blocks
overwrite it (2.0-2.5 s for 3 GiB on the main thread of a gVisor host). The file systems are
the real ones of this machine; which is which is read from ``/proc/self/mountinfo``, not from
the code under test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_cli.core.safetensors import writer

SIZE = 64 << 20


def _fs_type(path: Path) -> str:
    """The type of the mount that holds ``path`` (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, kind = "", ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, right.split()[0]
    return kind


def _fd(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)
        path.unlink()


@pytest.fixture
def shm_file() -> Iterator[int]:
    shm = Path("/dev/shm")
    if not shm.is_dir() or _fs_type(shm) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm on this machine")
    yield from _fd(shm / f"ckpt-test-reserve-{os.getpid()}")


@pytest.fixture
def disk_file(tmp_path: Path) -> Iterator[int]:
    kind = _fs_type(tmp_path)
    if kind not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"the test directory is on {kind or 'an unknown file system'}, not on a disk")
    yield from _fd(tmp_path / "f")


def test_on_tmpfs_the_file_is_sized_and_left_sparse(shm_file: int) -> None:
    writer._reserve(shm_file, SIZE)
    st = os.fstat(shm_file)
    assert st.st_size == SIZE
    assert st.st_blocks == 0  # glibc's posix_fallocate gave it all 64 MiB of memory here


def test_on_a_disk_the_blocks_are_reserved(disk_file: int) -> None:
    writer._reserve(disk_file, SIZE)
    st = os.fstat(disk_file)
    assert st.st_size == SIZE
    assert st.st_blocks * 512 >= SIZE


def test_tmpfs_is_told_apart_from_a_disk(shm_file: int, disk_file: int) -> None:
    assert writer._is_tmpfs(shm_file)
    assert not writer._is_tmpfs(disk_file)


def test_an_empty_file_is_left_empty(disk_file: int) -> None:
    writer._reserve(disk_file, 0)
    assert os.fstat(disk_file).st_size == 0
