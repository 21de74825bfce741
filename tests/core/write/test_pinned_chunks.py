"""Source chunks larger than the blocks read from them: TensorStore decodes each whole into the
writers' cache, so no more than ``PINNED_CHUNKS`` of them decode at once whatever the thread
count, and the cache's room for them comes out of the blocks' share of ``--memory-limit``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.write.pipeline import (
    PINNED_CHUNKS,
    Pipeline,
    held_limit,
    pinned_chunks,
    source_cache_bytes,
)
from ckpt_cli.core.write.types import ArrayOut, LeafOut

MIB = 1 << 20
ROWS, COLS, CHUNK_ROWS, SOURCE_ROWS = 64, 8, 4, 16


def _leaf(source: Any = None, source_rows: int | None = SOURCE_ROWS) -> LeafOut:
    return LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("float32", (ROWS, COLS), (CHUNK_ROWS, COLS), zarr3=False),
        source=source,
        source_chunks=(source_rows, COLS) if source_rows else None,
        source_chunk_bytes=source_rows * COLS * 4 if source_rows else None,
    )


def test_a_read_pins_the_larger_source_chunks_it_touches() -> None:
    leaf = _leaf()
    block = CHUNK_ROWS * COLS * 4
    assert pinned_chunks(leaf, (slice(0, 4), slice(0, 8)), block) == {("w", (0, 0))}
    # a block across two source chunks pins both
    assert pinned_chunks(leaf, (slice(12, 20), slice(0, 8)), 2 * block) == {
        ("w", (0, 0)),
        ("w", (1, 0)),
    }
    # whole source chunks (or larger reads) are decoded into the block: nothing pinned
    assert pinned_chunks(leaf, (slice(0, 16), slice(0, 8)), 4 * block) == frozenset()
    assert pinned_chunks(_leaf(source_rows=None), (slice(0, 4), slice(0, 8)), block) == set()


def test_the_caches_room_past_its_eighth_comes_out_of_the_blocks_share() -> None:
    # 32 MiB source chunks under 256 MiB: the cache holds two of them (64 MiB, 32 past its
    # eighth); the blocks' quarter (64 MiB) gives those 32 MiB back
    cache = source_cache_bytes(256 * MIB, [32 * MIB])
    assert cache == 64 * MIB
    assert held_limit(256 * MIB, threads_=13, cache_bytes=cache) == 32 * MIB
    # at the default limit an eighth holds two 32 MiB chunks: nothing changes
    assert source_cache_bytes(1 << 30, [32 * MIB]) == 128 * MIB
    assert held_limit(1 << 30, threads_=13, cache_bytes=128 * MIB) == 256 * MIB
    # 128 MiB chunks at the default: a 256 MiB cache, 128 MiB of blocks
    assert source_cache_bytes(1 << 30, [128 * MIB]) == 256 * MIB
    assert held_limit(1 << 30, threads_=13, cache_bytes=256 * MIB) == 128 * MIB
    # never less than one block (2 MiB under a 64 MiB limit)
    assert held_limit(64 * MIB, threads_=13, cache_bytes=32 * MIB) == 2 * MIB


@pytest.mark.parametrize(("slab_reads", "limit"), [(True, 32 * MIB), (False, 64 * MIB)])
def test_the_pipeline_sizes_its_blocks_with_the_sources_cache(
    slab_reads: bool, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scaled-out unit (no slab reads) has a cache of its eighth: its blocks keep their share."""
    monkeypatch.setattr(threads, "_chosen", 13)
    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("float32", (8192, 1024), (4096, 256), zarr3=False),
        source_chunks=(8192, 1024),
        source_chunk_bytes=32 * MIB,
    )
    writer = SimpleNamespace(
        in_flight=8, memory_limit=256 * MIB, finite_label=None, slab_reads=slab_reads
    )
    assert Pipeline(writer, [(leaf, [])], None).limit == limit  # type: ignore[arg-type]


class _Read:
    """A source read in flight until the pipeline takes its values."""

    def __init__(self, values: np.ndarray, region: tuple[slice, ...], log: dict[str, Any]):
        self.values, self.log = values, log
        self.chunk = region[0].start // SOURCE_ROWS
        log["live"].append(self.chunk)
        log["most"] = max(log["most"], len(set(log["live"])))

    def done(self) -> bool:
        return False

    def result(self) -> np.ndarray:
        self.log["live"].remove(self.chunk)
        return self.values


def test_no_more_than_two_large_source_chunks_decode_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tensorstore as ts

    monkeypatch.setattr(threads, "_chosen", 13)  # 13 reads in flight: four source chunks
    values = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    log: dict[str, Any] = {"live": [], "most": 0}

    def source(region: tuple[slice, ...]) -> _Read:
        return _Read(values[region].copy(), region, log)

    spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": [CHUNK_ROWS, COLS]}}
    out = ts.open(spec, create=True, dtype=ts.float32, shape=[ROWS, COLS]).result()
    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=64 * MIB,
        finite_label=None,
        slab_reads=True,
        open_array=lambda _: SimpleNamespace(result=lambda: out),
        dest="memory://",
    )
    blocks = [(slice(r, r + CHUNK_ROWS), slice(0, COLS)) for r in range(0, ROWS, CHUNK_ROWS)]
    pipe = Pipeline(writer, [(_leaf(source), blocks)], None)  # type: ignore[arg-type]
    assert pipe.depth == 13
    pipe.run()
    assert log["most"] == PINNED_CHUNKS  # not the four the depth would let in
    assert not log["live"] and not pipe.pinned
    np.testing.assert_array_equal(out.read().result(), values)
