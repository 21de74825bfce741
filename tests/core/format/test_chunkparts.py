"""Parts of a large chunk read from one pass over it (``LeafReader.read`` -> ``chunkparts``):
the values TensorStore reads for every layout that streams, edge chunks and 1-D/3-D leaves
included; each chunk decoded once whatever order the parts are read in, side by side or
concurrently; slabs dropped once every value has been read; a block over several chunks gets
each piece from its chunk's pass; a region read twice and a failed pass go to TensorStore (its
values, its error), with no claim left behind; ``CKPT_PART_READS=0`` turns it off; and what the
writers read this way rather than let TensorStore copy it."""

from __future__ import annotations

import itertools
import random
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core.format import chunkparts, chunkread
from ckpt_cli.core.format.arrays import ArrayInfo, LeafReader

Block = tuple[slice, ...]


def _array(
    tmp_path: Path, shape: tuple[int, ...], chunk: tuple[int, ...], driver: str, codec: str
) -> tuple[Any, np.ndarray]:
    x = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    if driver == "zarr":
        meta: dict[str, Any] = {
            "shape": list(shape),
            "chunks": list(chunk),
            "dtype": "<f4",
            "compressor": {"id": "zstd", "level": 1} if codec == "zstd" else None,
        }
    else:
        inner: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if codec == "zstd":
            inner.append({"name": "zstd", "configuration": {"level": 1}})
        meta = {
            "shape": list(shape),
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {"chunk_shape": list(chunk), "codecs": inner},
                }
            ],
        }
    spec = {"driver": driver, "kvstore": f"file://{tmp_path}/a/", "metadata": meta}
    ts.open(spec, create=True).result().write(x).result()
    return ts.open({"driver": driver, "kvstore": f"file://{tmp_path}/a/"}).result(), x


def _reader(arr: Any, shape: tuple[int, ...], chunk: tuple[int, ...], zarr: int) -> LeafReader:
    return LeafReader(arr, ArrayInfo("float32", shape, chunk, zarr, "zstd"))


def _grid(shape: tuple[int, ...], block: tuple[int, ...]) -> list[Block]:
    """Blocks of ``block``'s shape over ``shape`` (clipped at its edges), in C order."""
    starts = [range(0, n, b) for n, b in zip(shape, block, strict=True)]
    return [
        tuple(slice(a, min(a + b, n)) for a, b, n in zip(s, block, shape, strict=True))
        for s in itertools.product(*starts)
    ]


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1 MiB count as large here, and slabs are 64 KiB: many slabs a chunk."""
    monkeypatch.setattr(chunkread, "ROWS_MIN_CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(chunkparts, "SLAB_BYTES", 64 << 10)


CASES = [
    # shape, chunk (the edge chunks padded), output block: parts of each chunk side by side
    ((1300, 1024), (512, 1024), (256, 256)),
    ((1300, 1000), (700, 1000), (350, 500)),
    ((600_000,), (300_000,), (100_000,)),
    ((6, 300, 500), (4, 300, 500), (2, 150, 250)),
]


@pytest.mark.parametrize(
    ("driver", "codec"), [("zarr", "zstd"), ("zarr", "raw"), ("zarr3", "zstd")]
)
@pytest.mark.parametrize(("shape", "chunk", "block"), CASES)
def test_parts_equal_tensorstore_and_each_chunk_decodes_once(
    tmp_path: Path,
    driver: str,
    codec: str,
    shape: tuple[int, ...],
    chunk: tuple[int, ...],
    block: tuple[int, ...],
) -> None:
    arr, x = _array(tmp_path, shape, chunk, driver, codec)
    reader = _reader(arr, shape, chunk, 2 if driver == "zarr" else 3)
    blocks = _grid(shape, block)
    assert len(blocks) > 4
    futures = [reader.read(b) for b in blocks]  # issued in C order, as the writers issue them
    for b, fut in zip(blocks, futures, strict=True):
        assert isinstance(fut, Future), b  # decoded here, not by TensorStore
        got = fut.result()
        assert got.shape == x[b].shape and np.array_equal(got, x[b]), b
    parts = reader.own.parts
    assert isinstance(parts, chunkparts.ChunkParts)
    # Every slab of every chunk decoded once (the rows inside the array), none refused, and
    # nothing kept once all is read.
    inside = [-(-n // c) for n, c in zip(shape, chunk, strict=True)]
    slabs = 0
    for index in itertools.product(*(range(n) for n in inside)):
        rows = min(chunk[0], shape[0] - index[0] * chunk[0])
        slabs += -(-rows // parts.slab_rows)
    assert parts.decoded == slabs and parts.refused == 0
    assert parts.passes == {}


def test_any_order_of_the_parts_decodes_each_chunk_once(tmp_path: Path) -> None:
    """Claims issued in C order, their reads run in a shuffled order on 8 threads at once:
    every part right, each slab decoded once, none refused, nothing kept at the end."""
    shape, chunk = (1300, 1024), (512, 1024)
    arr, x = _array(tmp_path, shape, chunk, "zarr", "zstd")
    layout = chunkread.chunk_layout(arr.spec().to_json()["metadata"], _info(shape, chunk))
    assert layout is not None
    parts = chunkparts.ChunkParts(arr.kvstore, layout, shape, chunk, np.float32)
    blocks = _grid(shape, (128, 256))
    claims = [parts.claim(b) for b in blocks]
    assert all(c is not None for c in claims)
    order = list(zip(blocks, claims, strict=True))
    random.Random(5).shuffle(order)
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda bc: (bc[0], bc[1].fill(np.empty(x[bc[0]].shape, np.float32))), order)
        )
    assert results
    for b, got in results:
        assert np.array_equal(got, x[b]), b
    assert parts.decoded == sum(-(-r // parts.slab_rows) for r in (512, 512, 276))
    assert parts.refused == 0 and parts.passes == {}


def _info(shape: tuple[int, ...], chunk: tuple[int, ...]) -> ArrayInfo:
    return ArrayInfo("float32", shape, chunk, 2, "zstd")


def test_reads_in_c_order_keep_a_band_not_the_chunk(tmp_path: Path) -> None:
    """The slabs kept while parts are read one after another in C order: the band of rows the
    parts side by side share, never the chunk (what TensorStore's cache holds for a part)."""
    shape, chunk = (1024, 1024), (1024, 1024)  # one chunk of 4 MiB
    arr, x = _array(tmp_path, shape, chunk, "zarr", "zstd")
    reader = _reader(arr, shape, chunk, 2)
    kept: list[int] = []
    blocks = _grid(shape, (128, 256))  # bands of 128 rows (512 KiB), 4 parts side by side
    for b in blocks:
        assert np.array_equal(reader.read(b).result(), x[b])
        parts = reader.own.parts
        kept.append(sum(s.nbytes for p in parts.passes.values() for s in p.kept.values()))
    assert max(kept) <= 128 * 1024 * 4, max(kept)  # a band (8 slabs of 64 KiB), at most
    assert max(kept) > 0 and kept[-1] == 0


def test_a_region_read_twice_goes_to_tensorstore_and_blocks_over_chunks_to_their_passes(
    tmp_path: Path,
) -> None:
    shape, chunk = (1300, 1024), (512, 1024)
    arr, x = _array(tmp_path, shape, chunk, "zarr", "zstd")
    reader = _reader(arr, shape, chunk, 2)
    first = (slice(0, 256), slice(0, 1024))  # the top of chunk 0: read, then dropped
    fut = reader.read(first)
    assert isinstance(fut, Future)
    assert np.array_equal(fut.result(), x[first])
    again = (slice(0, 128), slice(0, 512))  # rows the pass (not over) has dropped
    fut = reader.read(again)
    assert not isinstance(fut, Future)
    assert np.array_equal(np.asarray(fut.result()), x[again])
    # Over three chunks, each in part (the edge one padded): one piece from each pass.
    over = (slice(500, 1100), slice(100, 300))
    fut = reader.read(over)
    assert isinstance(fut, Future)
    assert np.array_equal(fut.result(), x[over])
    # A block whose piece of chunk 0 can be served and whose piece of chunk 1 cannot (its top
    # rows read whole and dropped): all of it from TensorStore, and the claim taken on chunk 0
    # given back, so chunk 0's pass still ends once its values are read.
    fresh = _reader(arr, shape, chunk, 2)
    top_of_1 = (slice(512, 768), slice(0, 1024))
    assert np.array_equal(fresh.read(top_of_1).result(), x[top_of_1])
    mixed = (slice(400, 600), slice(0, 64))
    fut = fresh.read(mixed)
    assert not isinstance(fut, Future)
    assert np.array_equal(np.asarray(fut.result()), x[mixed])
    parts = fresh.own.parts
    assert parts is not None and parts.refused == 1 and (0, 0) in parts.passes
    for cols in (slice(0, 512), slice(512, 1024)):
        block = (slice(0, 512), cols)  # all of chunk 0, in two parts
        assert np.array_equal(fresh.read(block).result(), x[block])
    assert (0, 0) not in parts.passes


def test_turned_off_goes_to_tensorstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shape, chunk = (1300, 1024), (512, 1024)
    arr, _ = _array(tmp_path, shape, chunk, "zarr", "zstd")
    monkeypatch.setenv("CKPT_PART_READS", "0")
    assert not isinstance(_reader(arr, shape, chunk, 2).read((slice(0, 64), slice(0, 64))), Future)


def test_a_damaged_chunk_gets_tensorstores_error_and_fails_its_pass(tmp_path: Path) -> None:
    shape, chunk = (1300, 1024), (512, 1024)
    arr, x = _array(tmp_path, shape, chunk, "zarr", "zstd")
    damaged = tmp_path / "a" / "1.0"
    raw = damaged.read_bytes()
    damaged.write_bytes(raw[: len(raw) // 2])
    reader = _reader(arr, shape, chunk, 2)
    parts_of_1 = [(slice(a, a + 256), slice(c, c + 512)) for a in (512, 768) for c in (0, 512)]
    futures = [reader.read(b) for b in parts_of_1]
    assert all(isinstance(f, Future) for f in futures)
    errors = []
    for fut in futures:
        with pytest.raises(Exception) as here:
            fut.result()
        errors.append(here.value)
    with pytest.raises(Exception) as there:
        arr[512:768, 0:512].read().result()
    assert errors
    for e in errors:
        assert type(e) is type(there.value) and str(e) == str(there.value)
    # The other chunks still read from their passes.
    ok = (slice(0, 256), slice(0, 512))
    assert np.array_equal(reader.read(ok).result(), x[ok])
    assert reader.own.parts.passes.get((1, 0)) is None or reader.own.parts.passes[(1, 0)].failed


def test_concurrent_claims_on_one_slab_copy_it_once_each(tmp_path: Path) -> None:
    """Parts side by side read at once on many threads: one decodes, the others wait for
    the slab and copy their columns; each value lands where it belongs."""
    shape, chunk = (512, 1024), (512, 1024)
    arr, x = _array(tmp_path, shape, chunk, "zarr3", "zstd")
    reader = _reader(arr, shape, chunk, 3)
    blocks = _grid(shape, (512, 64))  # 16 parts, every one needs every slab
    futures = [reader.read(b) for b in blocks]
    for b, fut in zip(blocks, futures, strict=True):
        assert np.array_equal(fut.result(), x[b]), b
    assert reader.own.parts.decoded == -(-512 // reader.own.parts.slab_rows)


def test_reads_part_names_the_blocks_the_writers_leave_to_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OwnReads.reads_part``: what a writer reads itself instead of letting TensorStore copy
    the block (parts of large chunks), and nothing else."""
    shape, chunk = (1300, 1024), (512, 512)  # chunks of 1 MiB, two a row
    arr, _ = _array(tmp_path, shape, chunk, "zarr", "zstd")
    own = _reader(arr, shape, chunk, 2).own
    assert own.reads_part((slice(0, 256), slice(0, 512)))  # a part of chunk (0, 0)
    assert own.reads_part((slice(1024, 1300), slice(0, 100)))  # of the padded edge chunk
    assert own.reads_part((slice(500, 600), slice(0, 1024)))  # parts of four chunks
    assert not own.reads_part((slice(0, 512), slice(0, 512)))  # one whole chunk
    assert not own.reads_part((slice(0, 1024), slice(0, 1024)))  # four whole chunks
    assert not own.reads_part((slice(1024, 1300), slice(512, 1024)))  # the edge chunk, whole
    monkeypatch.setenv("CKPT_PART_READS", "0")
    assert not own.reads_part((slice(0, 256), slice(0, 512)))
    monkeypatch.delenv("CKPT_PART_READS")
    monkeypatch.setattr(chunkread, "ROWS_MIN_CHUNK_BYTES", 2 << 20)  # chunks of 1 MiB: small
    assert not own.reads_part((slice(0, 256), slice(0, 512)))


def test_the_passes_ask_where_chunks_lie_as_the_reader_says_now(tmp_path: Path) -> None:
    """``LeafReader.locate`` set after the passes were made (a writer asked ``reads_part``
    first) is the one they use."""
    shape, chunk = (1300, 1024), (512, 1024)
    arr, x = _array(tmp_path, shape, chunk, "zarr", "zstd")
    reader = _reader(arr, shape, chunk, 2)
    block = (slice(0, 256), slice(0, 512))
    assert reader.own.reads_part(block) and reader.own.parts is not None
    asked: list[str] = []
    reader.locate = lambda key: asked.append(key)  # None: read through the kvstore
    assert np.array_equal(reader.read(block).result(), x[block])
    assert asked == ["0.0"]
