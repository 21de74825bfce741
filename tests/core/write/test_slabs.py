"""The writers' pipeline reads a block larger than a slab piecewise: every element once, no
read over the slab budget, progress slab by slab, totals exact, values as the source's (cast to
the output dtype), and a failing slab is one storage error naming the leaf."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core.storage import open_location
from ckpt_cli.core.write.item import ItemWriter
from ckpt_cli.core.write.pipeline import block_budget, slab_budget, source_cache_bytes
from ckpt_cli.core.write.types import ArrayOut, LeafOut
from ckpt_cli.errors import StorageError

LIMIT = 16 << 20  # block budget 1 MiB, slab 1 MiB; a 4 MiB output chunk is read in 4 slabs
SHAPE = (2048, 1024)
CHUNK = (1024, 1024)


def _write(
    tmp_path: Path,
    dtype: str,
    source: Any,
    *,
    slab_reads: bool = True,
    source_chunk_bytes: int | None = None,
) -> tuple[np.ndarray, list[int]]:
    leaf = LeafOut(
        keypath=("params", "w"),
        key_types=(1, 1),
        value_type="jax.Array",
        array=ArrayOut(dtype, SHAPE, CHUNK, zarr3=False),
        source=source,
        source_chunk_bytes=source_chunk_bytes,
    )
    writer = ItemWriter(
        open_location(str(tmp_path)),
        use_ocdbt=False,
        use_zarr3=False,
        memory_limit=LIMIT,
        slab_reads=slab_reads,
    )
    reported: list[int] = []
    writer.write_arrays([leaf], reported.append)
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "params.w")}}
    return ts.open(spec).result().read().result(), reported


class _Source:
    def __init__(self, values: np.ndarray, fail_at: int | None = None) -> None:
        self.values = values
        self.regions: list[tuple[slice, ...]] = []
        self.fail_at = fail_at

    def __call__(self, region: tuple[slice, ...]) -> Any:
        self.regions.append(region)
        if self.fail_at is not None and len(self.regions) == self.fail_at:
            return _Failed()  # as a TensorStore read: the error comes with the result
        return self.values[region]


class _Failed:
    def result(self) -> Any:
        raise ValueError("the disk went away")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_chunk_over_the_slab_is_read_in_slabs(tmp_path: Path, dtype: str) -> None:
    values = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    source = _Source(values)
    out, reported = _write(tmp_path, dtype, source)
    expected = values.astype(out.dtype)
    assert out.dtype.name == dtype
    np.testing.assert_array_equal(out, expected)
    itemsize = np.dtype(out.dtype).itemsize
    assert source.regions
    slab = slab_budget(block_budget(LIMIT))
    for region in source.regions:
        assert math.prod(s.stop - s.start for s in region) * itemsize <= slab
    covered = np.zeros(SHAPE, dtype=np.int8)
    for region in source.regions:
        covered[region] += 1
    assert (covered == 1).all()  # every element read once
    assert sum(reported) == values.size * itemsize
    chunks = math.prod(s // c for s, c in zip(SHAPE, CHUNK, strict=True))
    assert len(reported) > 2 * chunks, reported  # moved within each chunk, not once per chunk


def test_without_slab_reads_blocks_are_whole(tmp_path: Path) -> None:
    values = np.arange(math.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    source = _Source(values)
    out, reported = _write(tmp_path, "float32", source, slab_reads=False)
    np.testing.assert_array_equal(out, values)
    assert [tuple((s.start, s.stop) for s in r) for r in source.regions] == [
        ((0, 1024), (0, 1024)),
        ((1024, 2048), (0, 1024)),
    ]
    assert reported == [4 << 20, 4 << 20]


def test_a_source_chunk_over_a_quarter_of_the_limit_is_read_per_block(tmp_path: Path) -> None:
    """Slabs of it would each decode it again (the cache does not hold it): whole blocks."""
    values = np.ones(SHAPE, dtype=np.float32)
    source = _Source(values)
    out, reported = _write(tmp_path, "float32", source, source_chunk_bytes=LIMIT // 4 + 1)
    np.testing.assert_array_equal(out, values)
    assert len(source.regions) == 2
    assert reported == [4 << 20, 4 << 20]
    source = _Source(values)
    _write(tmp_path / "fits", "float32", source, source_chunk_bytes=LIMIT // 4)
    assert len(source.regions) > 2


def test_a_failing_slab_is_one_storage_error_naming_the_leaf(tmp_path: Path) -> None:
    values = np.zeros(SHAPE, dtype=np.float32)
    with pytest.raises(StorageError, match=r"cannot read the source of leaf 'params.w'.*went away"):
        _write(tmp_path, "float32", _Source(values, fail_at=3))


def test_the_source_cache_holds_two_chunks_over_a_slab() -> None:
    slab = slab_budget(block_budget(1 << 30))
    assert source_cache_bytes(1 << 30, [slab, 1 << 10]) == (1 << 30) // 8
    # two chunks of 256 MiB: more than the eighth, so the room for them is the cache
    assert source_cache_bytes(1 << 30, [256 << 20, slab]) == 512 << 20
    assert source_cache_bytes(1 << 30, [32 << 20]) == (1 << 30) // 8  # the eighth holds two
    assert source_cache_bytes(1 << 30, []) == (1 << 30) // 8
    # A chunk over a quarter of the limit is not read in slabs: no room kept for it.
    assert source_cache_bytes(1 << 30, [512 << 20]) == (1 << 30) // 8
