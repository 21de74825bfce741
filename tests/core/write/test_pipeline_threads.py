"""The writers keep a block in flight per thread (``--threads``), their bytes still capped by
the memory limit."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.write.pipeline import Pipeline

MIB = 1 << 20


@pytest.mark.parametrize(
    ("n", "depth", "limit"),
    [(1, 4, 64 * MIB), (2, 4, 128 * MIB), (4, 4, 256 * MIB), (12, 12, 256 * MIB)],
)
def test_blocks_in_flight_follow_the_threads(
    n: int, depth: int, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 GiB limit: blocks of 32 MiB, two a thread, and never more than a quarter of the limit
    (the bytes in flight do not grow past it with the threads)."""
    monkeypatch.setattr(threads, "_chosen", n)
    writer = SimpleNamespace(in_flight=8, memory_limit=1 << 30, finite_label=None, slab_reads=True)
    pipe = Pipeline(writer, [], None)  # type: ignore[arg-type]
    assert pipe.budget == 32 * MIB
    assert pipe.depth == depth
    assert pipe.limit == limit


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
        fresh_blocks=True,
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
        finite_label=None,
        slab_reads=False,
        open_array=open_array,
        dest="memory://",
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


class _Logged:
    """A write's commit that logs when the pipeline waits for it."""

    def __init__(self, fut: object, log: list[str], name: str) -> None:
        self.fut = fut
        self.log = log
        self.name = name

    def result(self) -> object:
        self.log.append(f"write {self.name}")
        return self.fut.result()  # type: ignore[attr-defined]


class _Pending:
    """A read still decoding (``done()`` is False) until the pipeline waits for it."""

    def __init__(self, values: object, log: list[str], name: str) -> None:
        self.values = values
        self.log = log
        self.name = name

    def done(self) -> bool:
        return False

    def result(self) -> object:
        self.log.append(f"read {self.name}")
        return self.values


def test_over_the_limit_the_oldest_write_finishes_before_more_reads_are_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With more threads than the byte limit has blocks, the pipeline used to wait for every
    read in flight before finishing a write, so the read pool ran dry each time the budget
    filled (13 threads slower than 4 on the 13-core host). Now it waits for one read, then
    finishes the oldest write, one of each at a time."""
    import numpy as np
    import tensorstore as ts

    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    monkeypatch.setattr(threads, "_chosen", 32)  # depth 32: the byte limit is what binds
    rows, cols, chunk_rows = 96, 32768, 8
    block = chunk_rows * cols * 4  # 1 MiB: one output chunk, the least budget
    log: list[str] = []

    def source(region: tuple[slice, ...]) -> _Pending:
        shape = tuple(s.stop - s.start for s in region)
        return _Pending(np.full(shape, region[0].start, np.float32), log, str(region[0].start))

    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("float32", (rows, cols), (chunk_rows, cols), zarr3=False),
        source=source,  # type: ignore[arg-type]
    )
    spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": [chunk_rows, cols]}}
    real = ts.open(spec, create=True, dtype=ts.float32, shape=[rows, cols]).result()

    class Array:
        dtype = real.dtype

        def __getitem__(self, region: tuple[slice, ...]) -> object:
            class Part:
                def write(self, values: object, **kw: object) -> object:
                    w = real[region].write(values, **kw)
                    return type("W", (), {"commit": _Logged(w.commit, log, str(region[0].start))})

            return Part()

    promise, opened = ts.Promise.new()
    promise.set_result(Array())
    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=16 * block,
        finite_label=None,
        slab_reads=False,
        open_array=lambda _: opened,
        dest="memory://",
    )
    regions = [(slice(r, r + chunk_rows), slice(0, cols)) for r in range(0, rows, chunk_rows)]
    pipe = Pipeline(writer, [(leaf, regions)], None)  # type: ignore[arg-type]
    assert pipe.limit == 4 * block
    pipe.run()
    reads = [e for e in log if e.startswith("read")]
    writes = [e for e in log if e.startswith("write")]
    assert len(reads) == len(writes) == len(regions)
    # Never two reads waited for in a row while a write could free room (the old order waited
    # for all five in flight, then finished four writes).
    first_write = log.index("write 0")
    assert log[:first_write] == ["read 0"], log
    runs = [len(list(g)) for k, g in itertools.groupby(e.split()[0] for e in log)]
    assert max(runs[:-2]) <= 1, log  # alternating until the final drain of reads, then writes
    # And the values written are the blocks' own.
    assert (real[::chunk_rows, 0].read().result() == np.arange(0, rows, chunk_rows)).all()
