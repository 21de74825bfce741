"""Blocks written in file order go to the disk through one reused staging buffer (``O_DIRECT``);
the file is the bytes the ``safetensors`` library writes, synced once before its rename, and a
block out of order or no ``O_DIRECT`` falls back to the page cache with the same bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy as stn

from ckpt_cli.core.safetensors import SafetensorsWriter, TensorSpec, plan_files
from ckpt_cli.core.safetensors import writer as writer_mod
from ckpt_cli.core.safetensors.blocks import contiguous_blocks


def tensors() -> dict[str, Any]:
    rng = np.random.default_rng(7)
    return {
        "a": rng.standard_normal((37, 129)).astype(np.float32),  # 19,092 bytes: pages apart
        "b": rng.integers(0, 255, size=(3001,), dtype=np.uint8),  # odd length
        "c": rng.standard_normal((64, 64)).astype(np.float64),
    }


def blocks(ts: dict[str, Any], max_bytes: int) -> list[tuple[str, tuple[int, ...], Any]]:
    """The blocks in file order (the library orders tensors by alignment, then name)."""
    out = []
    for entry in plan(ts).files[0].header.tensors:
        name, arr = entry.name, ts[entry.name]
        for start, shape in contiguous_blocks(arr.shape, arr.dtype.itemsize, max_bytes):
            index = tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))
            out.append((name, start, arr[index]))
    return out


def plan(ts: dict[str, Any]) -> Any:
    return plan_files(
        [TensorSpec(k, v.dtype.name, v.shape) for k, v in ts.items()],
        max_shard_size=None,
        metadata={"format": "pt"},
    )


def write(path: Path, jobs: list[tuple[str, tuple[int, ...], Any]], ts: dict[str, Any]) -> Any:
    with SafetensorsWriter(str(path), plan(ts).files[0]) as w:
        for name, start, block in jobs:
            w.write_block(name, start, block)
        w.commit()
    return w


@pytest.fixture
def small_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three pages: the stage fills and is written out many times within these few KiB.
    monkeypatch.setattr(writer_mod, "STAGE_BYTES", 3 * writer_mod.PAGE)


def direct_io_here(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    stream = writer_mod._DirectStream.open(str(probe), b"")
    if stream is None:
        return False
    stream.close()
    return True


def test_blocks_in_order_go_direct_and_equal_the_library(small_stage: None, tmp_path: Path) -> None:
    if not direct_io_here(tmp_path):
        pytest.skip("no O_DIRECT on this file system")
    ts = tensors()
    path = tmp_path / "x.safetensors"
    w = write(path, blocks(ts, 5000), ts)
    assert path.read_bytes() == stn.save(ts, metadata={"format": "pt"})
    assert w.direct_bytes == path.stat().st_size  # every byte, the header too


def test_a_block_out_of_order_falls_back_with_the_same_bytes(
    small_stage: None, tmp_path: Path
) -> None:
    ts = tensors()
    jobs = blocks(ts, 5000)
    jobs[3], jobs[5] = jobs[5], jobs[3]
    path = tmp_path / "x.safetensors"
    w = write(path, jobs, ts)
    assert path.read_bytes() == stn.save(ts, metadata={"format": "pt"})
    assert w.direct_bytes < path.stat().st_size  # what was staged went through the cache
    if direct_io_here(tmp_path):
        assert w.direct_bytes > 0  # the first pages went direct


def test_without_direct_io_the_same_bytes(
    small_stage: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_NO_DIRECT_IO", "1")
    ts = tensors()
    path = tmp_path / "x.safetensors"
    w = write(path, blocks(ts, 5000), ts)
    assert path.read_bytes() == stn.save(ts, metadata={"format": "pt"})
    assert w.direct_bytes == 0


@pytest.mark.parametrize("no_direct", [False, True])
def test_one_fsync_per_file_before_its_rename(
    no_direct: bool, small_stage: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if no_direct:
        monkeypatch.setenv("CKPT_NO_DIRECT_IO", "1")
    calls: list[str] = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        calls.append(f"fsync {os.readlink(f'/proc/self/fd/{fd}')}")
        fsync(fd)

    def spy_replace(a: Any, b: Any) -> None:
        calls.append(f"replace {a}")
        replace(a, b)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    ts = tensors()
    w = write(tmp_path / "x.safetensors", blocks(ts, 5000), ts)
    assert calls == [f"fsync {w.tmp_path}", f"replace {w.tmp_path}"]
