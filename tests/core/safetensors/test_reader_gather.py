"""``SafetensorsReader.read_box`` of boxes made of many short runs (a column band of a kernel
that a transposing spec compares): copied from mappings of the file a window at a time, equal
to what numpy's slicing of the tensor gives, and refused with one line when the file shrank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy as stn

from ckpt_cli.core.safetensors import reader as reader_mod
from ckpt_cli.core.safetensors.reader import LocalFile, SafetensorsReader
from ckpt_cli.errors import InvalidSafetensorsError
from tests.support.random_tensors import random_array


@pytest.fixture
def gathered(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record each gather (the box's first-axis extent and the window's rows)."""
    calls: list[tuple[int, int]] = []
    real = LocalFile.gather

    def spy(self: LocalFile, offset: int, shape: tuple[int, ...], region: tuple[slice, ...], out: object) -> int:  # fmt: skip
        calls.append((region[0].stop - region[0].start, len(shape)))
        return real(self, offset, shape, region, out)

    monkeypatch.setattr(LocalFile, "gather", spy)
    return calls


@pytest.mark.parametrize("window", [256, 4096, 1 << 20])
def test_a_gathered_box_equals_numpy_slicing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gathered: list[tuple[int, int]], window: int
) -> None:
    # Windows of one row, of a few rows and of the whole tensor; every dtype width and bool.
    monkeypatch.setattr(reader_mod, "GATHER_WINDOW_BYTES", window)
    rng = np.random.default_rng(3)
    tensors = {
        "k": random_array(rng, "float32", (64, 48)),
        "h": random_array(rng, "bfloat16", (5, 12, 16)),
        "b": random_array(rng, "bool", (40, 9)),
        "d": random_array(rng, "float64", (20, 6)),
        "i": random_array(rng, "int8", (33, 17)),
    }
    path = tmp_path / "x.safetensors"
    stn.save_file(tensors, str(path))
    with SafetensorsReader.open(str(path)) as r:
        for name, arr in tensors.items():
            for _ in range(30):
                region = []
                for n in arr.shape:
                    a = int(rng.integers(0, n))
                    region.append(slice(a, int(rng.integers(a + 1, n + 1))))
                got = r.read_box(name, tuple(region))
                want = arr[tuple(region)]
                assert got.shape == want.shape and got.dtype == want.dtype
                assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, region)
        # A column band: many runs, gathered.
        band = r.read_box("k", (slice(0, 64), slice(8, 16)))
        assert band.tobytes() == np.ascontiguousarray(tensors["k"][:, 8:16]).tobytes()
    assert gathered and (64, 2) in gathered


def test_long_runs_and_rows_larger_than_a_window_are_read_run_by_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gathered: list[tuple[int, int]]
) -> None:
    monkeypatch.setattr(reader_mod, "GATHER_RUN_BYTES", 64)
    arr = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    path = tmp_path / "x.safetensors"
    stn.save_file({"k": arr}, str(path))
    with SafetensorsReader.open(str(path)) as r:
        assert r.read_box("k", (slice(0, 64), slice(0, 40))).tobytes() == arr[:, :40].tobytes()
        assert not gathered  # runs of 160 bytes: one read each
        assert r.read_box("k", (slice(0, 64), slice(0, 8))).tobytes() == arr[:, :8].tobytes()
        assert gathered == [(64, 2)]
        monkeypatch.setattr(reader_mod, "GATHER_WINDOW_BYTES", 100)  # a row is 192 bytes
        assert r.read_box("k", (slice(3, 9), slice(5, 7))).tobytes() == arr[3:9, 5:7].tobytes()
        assert gathered == [(64, 2)]


def test_a_file_that_shrank_is_refused_in_one_line(tmp_path: Path) -> None:
    arr = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    path = tmp_path / "x.safetensors"
    stn.save_file({"k": arr}, str(path))
    with SafetensorsReader.open(str(path)) as r:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size - 4096)  # past the end: a mapping would be SIGBUS
        with pytest.raises(InvalidSafetensorsError, match="changed while being read"):
            r.read_box("k", (slice(0, 256), slice(0, 4)))
