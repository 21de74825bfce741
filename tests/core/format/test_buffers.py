"""Block buffers handed back by the writers (``format/buffers.py``): reused only when nothing
else refers to the array or its buffer, TensorStore included; bounded; switchable off."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from ckpt_cli.core.format import buffers

SHAPE = (256, 1024)  # 1 MiB of float32: the least size kept


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    buffers.clear()
    yield
    buffers.clear()


def test_a_block_handed_back_is_the_next_ones_buffer() -> None:
    a = buffers.empty(SHAPE, np.float32)
    first = id(a.base)  # not a reference: one would keep the buffer from being reused
    assert buffers.recycle(a)
    del a
    b = buffers.empty(SHAPE, np.float32)
    assert id(b.base) == first
    c = buffers.empty(SHAPE, np.float32)  # none free: a new one
    assert id(c.base) != first


def test_a_block_anyone_else_still_holds_is_not_reused() -> None:
    a = buffers.empty(SHAPE, np.float32)
    other = a  # a second name for the same array
    assert not buffers.recycle(a)
    del other
    b = buffers.empty(SHAPE, np.float32)
    view = b.reshape(-1)  # another array over the same buffer
    assert not buffers.recycle(b)
    assert view.base is b.base
    assert not buffers.recycle(np.empty(SHAPE, np.float32))  # not from here
    assert buffers._free == []


def test_small_blocks_other_sizes_and_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    small = buffers.empty((4, 4), np.float32)
    assert small.base is None and not buffers.recycle(small)
    blocks = [buffers.empty(SHAPE, np.float32) for _ in range(buffers.KEEP + 2)]
    kept = [buffers.recycle(blocks.pop()) for _ in range(buffers.KEEP + 2)]
    assert kept == [True] * buffers.KEEP + [False, False]
    assert len(buffers._free) == buffers.KEEP
    wide = buffers.empty((512, 1024), np.float32)  # another size: the free ones are dropped
    assert buffers._free == [] and wide.shape == (512, 1024)
    monkeypatch.setenv("CKPT_REUSE_BUFFERS", "0")
    off = buffers.empty(SHAPE, np.float32)
    assert off.base is None


@pytest.mark.parametrize("cache_bytes", [0, 1 << 30])
def test_tensorstore_lets_go_of_a_written_block_unless_it_caches_it(cache_bytes: int) -> None:
    """A block written without a copy (``can_reference_source_data_indefinitely``) is held by
    TensorStore through a reference until its write is done, and longer where the output's
    context keeps a chunk cache: then it is not reused. Reused or not, what was written reads
    back as written after the next block overwrites the buffer."""
    import tensorstore as ts

    ctx = ts.Context({"cache_pool": {"total_bytes_limit": cache_bytes}})
    spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": list(SHAPE)}}
    arr = ts.open(spec, create=True, dtype=ts.float32, shape=[512, 1024], context=ctx).result()
    values = buffers.empty(SHAPE, np.float32)
    values[:] = 1.5
    write = arr[: SHAPE[0]].write(values, can_reference_source_data_indefinitely=True)
    assert sys.getrefcount(values) == 3  # this name, getrefcount's own, TensorStore's
    write.commit.result()
    del write
    # TensorStore drops its reference on its own thread just after the commit resolves (a
    # block offered back inside that window is refused: the writers then map a new one).
    deadline = time.monotonic() + 2
    while sys.getrefcount(values) > 2 and time.monotonic() < deadline and not cache_bytes:
        time.sleep(0.005)
    first = id(values.base)
    assert buffers.recycle(values) is (cache_bytes == 0)
    del values
    reused = buffers.empty(SHAPE, np.float32)
    # The written block's own buffer where TensorStore let go; else a new one (the old one
    # still alive in TensorStore's cache, so no new buffer can share its id).
    assert (id(reused.base) == first) is (cache_bytes == 0)
    reused[:] = 7.0
    assert np.all(arr[: SHAPE[0]].read().result() == 1.5)
