"""Reads of whole large chunks decode here (``LeafReader.read`` -> ``chunkread.read_rows``):
the values TensorStore reads, for every layout that streams and for edge chunks; any other block
goes to TensorStore; a damaged chunk gets TensorStore's own error; ``CKPT_ROW_READS=0`` turns
it off. A block of several chunks is decoded a chunk a task, all at once on the read pool, into
one buffer made when the first of them starts."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core import threads
from ckpt_cli.core.format import buffers, chunkread
from ckpt_cli.core.format.arrays import ArrayInfo, LeafReader

ROWS, COLS, CHUNK_ROWS = 1300, 1024, 512  # chunks of 2 MiB (float32): the edge one padded


def _array(tmp_path: Path, driver: str, codec: str, dtype: str = "float32") -> tuple[Any, Any]:
    import ml_dtypes

    rng = np.random.default_rng(7)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    if dtype == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16)
    if driver == "zarr":
        meta: dict[str, Any] = {
            "shape": [ROWS, COLS],
            "chunks": [CHUNK_ROWS, COLS],
            "dtype": "<f4" if dtype == "float32" else "bfloat16",
            "compressor": {"id": "zstd", "level": 1} if codec == "zstd" else None,
        }
    else:
        inner = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if codec == "zstd":
            inner.append({"name": "zstd", "configuration": {"level": 1}})
        meta = {
            "shape": [ROWS, COLS],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [CHUNK_ROWS, COLS]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {"chunk_shape": [CHUNK_ROWS, COLS], "codecs": inner},
                }
            ],
        }
    spec = {"driver": driver, "kvstore": f"file://{tmp_path}/a/", "metadata": meta}
    arr = ts.open(spec, create=True).result()
    arr.write(x).result()
    return ts.open({"driver": driver, "kvstore": f"file://{tmp_path}/a/"}).result(), x


def _reader(arr: Any, dtype: str = "float32", zarr: int = 2) -> LeafReader:
    info = ArrayInfo(dtype, (ROWS, COLS), (CHUNK_ROWS, COLS), zarr, "zstd")
    return LeafReader(arr, info)


@pytest.fixture(autouse=True)
def _small_chunks_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunkread, "ROWS_MIN_CHUNK_BYTES", 1 << 20)


@pytest.mark.parametrize(
    ("driver", "codec", "dtype"),
    [
        ("zarr", "zstd", "float32"),
        ("zarr", "raw", "float32"),
        ("zarr", "zstd", "bfloat16"),
        ("zarr3", "zstd", "float32"),
        ("zarr3", "raw", "bfloat16"),
    ],
)
def test_whole_chunk_rows_decode_here_and_equal_tensorstore(
    tmp_path: Path, driver: str, codec: str, dtype: str
) -> None:
    arr, x = _array(tmp_path, driver, codec, dtype)
    reader = _reader(arr, dtype, 2 if driver == "zarr" else 3)
    blocks = [(0, ROWS), (0, CHUNK_ROWS), (CHUNK_ROWS, 2 * CHUNK_ROWS), (1024, ROWS)]
    for a, b in blocks:
        block = (slice(a, b), slice(0, COLS))
        fut = reader.read(block)
        assert isinstance(fut, Future), (a, b)  # decoded here, not by TensorStore
        got = fut.result()
        assert got.dtype == x.dtype and got.shape == (b - a, COLS)
        assert np.array_equal(got.view(np.uint8), x[a:b].view(np.uint8)), (a, b)


def test_parts_of_chunks_decode_here_too(tmp_path: Path) -> None:
    """Blocks that are not whole full-width chunks: parts of one or several chunks, read from
    passes over those chunks (``chunkparts``, its own tests), with TensorStore's values."""
    arr, x = _array(tmp_path, "zarr", "zstd")
    reader = _reader(arr)
    others = [
        (slice(256, 768), slice(0, COLS)),  # not on chunk boundaries
        (slice(0, 2 * CHUNK_ROWS), slice(0, 512)),  # part of each row of two chunks
    ]
    for block in others:
        fut = reader.read(block)
        assert isinstance(fut, Future), block
        assert np.array_equal(np.asarray(fut.result()), x[block])


def test_turned_off_and_small_chunks_go_to_tensorstore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arr, _ = _array(tmp_path, "zarr", "zstd")
    block = (slice(0, CHUNK_ROWS), slice(0, COLS))
    monkeypatch.setenv("CKPT_ROW_READS", "0")
    monkeypatch.setenv("CKPT_PART_READS", "0")  # else the whole chunk is read as its one part
    assert not isinstance(_reader(arr).read(block), Future)
    monkeypatch.delenv("CKPT_PART_READS")
    monkeypatch.delenv("CKPT_ROW_READS")
    monkeypatch.setattr(chunkread, "ROWS_MIN_CHUNK_BYTES", 4 << 20)  # chunks of 2 MiB
    assert not isinstance(_reader(arr).read(block), Future)


def test_a_damaged_chunk_gets_tensorstores_error(tmp_path: Path) -> None:
    arr, _ = _array(tmp_path, "zarr", "zstd")
    chunk = tmp_path / "a" / "1.0"
    raw = chunk.read_bytes()
    chunk.write_bytes(raw[: len(raw) // 2])
    block = (slice(CHUNK_ROWS, 2 * CHUNK_ROWS), slice(0, COLS))
    with pytest.raises(Exception) as here:
        _reader(arr).read(block).result()
    with pytest.raises(Exception) as there:
        arr[block].read().result()
    assert type(here.value) is type(there.value) and str(here.value) == str(there.value)


def test_rows_region_takes_only_whole_full_width_chunks() -> None:
    shape, chunk = (1300, 64), (512, 64)
    full = slice(0, 64)
    assert chunkread.rows_region(shape, chunk, (slice(0, 1300), full)) == (0, 1300)
    assert chunkread.rows_region(shape, chunk, (slice(512, 1024), full)) == (512, 1024)
    assert chunkread.rows_region(shape, chunk, (slice(0, 100), full)) is None
    assert chunkread.rows_region(shape, chunk, (slice(0, 512), slice(0, 32))) is None
    assert chunkread.rows_region(shape, (512, 32), (slice(0, 512), full)) is None
    assert chunkread.rows_region((), (), ()) is None


@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_writers_read_whole_chunks_from_the_data_files(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """``reshard`` and ``migrate`` of a one-device save with recorded digests (so each block's
    values pass through ckpt, to be checked against them; without, TensorStore copies an
    unchanged leaf by itself): each whole chunk is decoded on the read pool from its data file,
    at the place the source's structure check found (not through the OCDBT kvstore), and the
    output holds the source's values."""
    import orbax.checkpoint as ocp

    from tests.support.cli import run_cli
    from tests.support.read_count import file_values_opened, save_one_chunk_leaves

    state = save_one_chunk_leaves(tmp_path / "src")
    recorded = run_cli(["verify", str(tmp_path / "src"), "--record"], capsys)
    assert recorded.code == 0, recorded.stderr
    opened = file_values_opened(monkeypatch, chunkread)
    out = tmp_path / "out"
    if command == "reshard":
        args = ["reshard", str(tmp_path / "src"), str(out), "--mesh", "data=2", "--rule", "*=[data, null]"]  # fmt: skip
    else:
        spec = tmp_path / "keep.yaml"
        spec.write_text(
            "version: 1\nrules:\n  - {op: cast, match: 'params\\.w', dtype: bfloat16}\n"
        )
        args = ["migrate", str(tmp_path / "src"), str(out), "--spec", str(spec)]
    result = run_cli(args, capsys)
    assert result.code == 0, result.stderr
    # Both leaves are one chunk of 2 MiB or more (the threshold lowered to 1 MiB here).
    assert len(opened) == 2 and all("/d/" in p for p in opened), opened
    restored = ocp.CheckpointManager(out).restore(0, args=ocp.args.StandardRestore())
    params = state["params"]
    assert isinstance(params, dict) and params
    for name, value in params.items():
        want = np.asarray(value)
        if command == "migrate" and name == "w":
            import ml_dtypes

            want = want.astype(ml_dtypes.bfloat16)
        got = np.asarray(restored["params"][name])
        assert got.dtype == want.dtype and np.array_equal(got, want), name


def _spy_rows(monkeypatch: pytest.MonkeyPatch, before: Any) -> list[tuple[tuple[int, int], int]]:
    """Record each ``read_rows`` call (its rows, its thread), calling ``before(rows)`` first."""
    calls: list[tuple[tuple[int, int], int]] = []
    real = chunkread.read_rows

    def spy(kv: Any, layout: Any, chunk_rows: int, rows: Any, out: Any, locate: Any) -> Any:
        calls.append((rows, threading.get_ident()))
        before(rows)
        return real(kv, layout, chunk_rows, rows, out, locate)

    monkeypatch.setattr(chunkread, "read_rows", spy)
    return calls


def test_a_block_of_several_chunks_is_decoded_a_chunk_a_thread_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arr, x = _array(tmp_path, "zarr", "zstd")
    monkeypatch.setattr(threads, "_chosen", 5)  # a pool of its own
    together = threading.Barrier(3, timeout=10)  # passes only when all three parts run at once
    calls = _spy_rows(monkeypatch, lambda rows: together.wait())
    got = _reader(arr).read((slice(0, ROWS), slice(0, COLS))).result()
    assert sorted(rows for rows, _ in calls) == [(0, 512), (512, 1024), (1024, ROWS)]
    assert len({thread for _, thread in calls}) == 3 and not together.broken
    assert np.array_equal(got.view(np.uint8), x.view(np.uint8))


def test_a_part_that_fails_leaves_the_block_to_tensorstore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arr, x = _array(tmp_path, "zarr", "zstd")
    monkeypatch.setattr(threads, "_chosen", 2)

    def fail_the_middle(rows: tuple[int, int]) -> None:
        if rows == (512, 1024):
            raise OSError("a read that failed")

    calls = _spy_rows(monkeypatch, fail_the_middle)
    got = _reader(arr).read((slice(0, ROWS), slice(0, COLS))).result()
    assert len(calls) == 3
    assert np.array_equal(np.asarray(got).view(np.uint8), x.view(np.uint8))


def test_the_blocks_buffer_is_made_when_its_first_part_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arr, x = _array(tmp_path, "zarr", "zstd")
    monkeypatch.setattr(threads, "_chosen", 1)
    made: list[tuple[int, ...]] = []
    real = buffers.empty
    monkeypatch.setattr(
        buffers, "empty", lambda shape, dtype: made.append(shape) or real(shape, dtype)
    )
    gate = threading.Event()
    busy = threads.read_pool().submit(gate.wait, 30)  # the pool's one thread, held
    fut = _reader(arr).read((slice(0, 2 * CHUNK_ROWS), slice(0, COLS)))
    assert made == [] and not fut.done()  # queued: no memory held yet
    gate.set()
    got = fut.result()
    assert busy.result() is True and made == [(2 * CHUNK_ROWS, COLS)]
    assert np.array_equal(got.view(np.uint8), x[: 2 * CHUNK_ROWS].view(np.uint8))
