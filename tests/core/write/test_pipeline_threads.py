"""The writers keep a block in flight per thread (``--threads``), their bytes still capped by
the memory limit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.write.pipeline import Pipeline


@pytest.mark.parametrize(("n", "depth"), [(1, 4), (4, 4), (12, 12)])
def test_blocks_in_flight_follow_the_threads(
    n: int, depth: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(threads, "_chosen", n)
    writer = SimpleNamespace(in_flight=8, memory_limit=1 << 30, slab_reads=True)
    pipe = Pipeline(writer, [], None)  # type: ignore[arg-type]
    assert pipe.depth == depth
    assert pipe.limit == (1 << 30) // 4  # the bytes in flight do not grow with the threads


class _Read:
    """A source read of float32 values, counted as outstanding until the pipeline takes it."""

    def __init__(self, shape: tuple[int, ...], live: list[int]) -> None:
        import numpy as np

        self.values = np.ones(shape, dtype=np.float32)
        self.live = live
        live[0] += self.values.nbytes
        live[1] = max(live[1], live[0])

    def result(self) -> object:
        self.live[0] -= self.values.nbytes
        return self.values


def test_a_cast_counts_its_source_values_against_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """float32 read, bfloat16 written: a block in flight holds its float32 values, so the
    limit counts those (before, it counted the bfloat16 block and let twice the limit's bytes
    of source values wait: 9 MiB here)."""
    import tensorstore as ts

    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    monkeypatch.setattr(threads, "_chosen", 32)  # depth 32: the byte limit is what binds
    rows, cols, chunk_rows = 96, 32768, 8
    block_f32 = chunk_rows * cols * 4  # 1 MiB of float32 per output chunk (the least budget)
    live = [0, 0]

    def source(region: tuple[slice, ...]) -> _Read:
        return _Read(tuple(s.stop - s.start for s in region), live)

    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("bfloat16", (rows, cols), (chunk_rows, cols), zarr3=False),
        source=source,  # type: ignore[arg-type]
        source_itemsize=4,
    )

    def open_array(_: LeafOut) -> object:
        spec = {
            "driver": "zarr",
            "kvstore": "memory://",
            "metadata": {"chunks": [chunk_rows, cols]},
        }
        return ts.open(spec, create=True, dtype=ts.bfloat16, shape=[rows, cols])

    # A limit of four float32 blocks (blocks of one output chunk: the budget is one chunk).
    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=16 * block_f32,
        slab_reads=False,
        open_array=open_array,
        dest="memory://",
        fresh_sources=True,
    )
    pipe = Pipeline(
        writer,
        [(leaf, [(slice(r, r + chunk_rows), slice(0, cols)) for r in range(0, rows, chunk_rows)])],
        None,
    )  # type: ignore[arg-type]
    assert pipe.limit == 4 * block_f32
    pipe.run()
    assert live[0] == 0
    # The last read is asked for before the pipeline sees the limit passed: one block over.
    assert 2 * block_f32 <= live[1] <= pipe.limit + block_f32, live


def test_a_scaled_out_unit_carries_the_source_itemsize_to_its_worker() -> None:
    """A worker rebuilds the leaf from its unit: the cast's source bytes are counted there too."""
    from ckpt_cli.core.write.distributed import _unit_leaf
    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("bfloat16", (16, 8), (4, 8), zarr3=False),
        source_itemsize=4,
        plan=object(),  # type: ignore[arg-type]  # what rebuilds the source: not run here
    )
    unit = _unit_leaf(leaf, [(slice(0, 4), slice(0, 8))])
    assert unit.source_itemsize == 4
