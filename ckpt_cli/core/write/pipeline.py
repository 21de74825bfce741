"""The block pipeline behind ``ItemWriter``: chunk-aligned regions of many leaves in flight,
source reads and destination writes overlapping as TensorStore futures, under a byte budget."""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ckpt_cli.core.format.blocks import aligned_block, iter_blocks
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.write.types import ArraySink, LeafOut, Region
from ckpt_cli.errors import StorageError, first_line


def block_budget(memory_limit: int, in_flight: int = 8) -> int:
    """Bytes of one block in flight: a block costs about three times its size (TensorStore's
    decoded source chunks, the values, the encoded output), so blocks get a quarter of the
    limit and the chunk cache an eighth; the rest is headroom for encoders and the allocator."""
    return max(1 << 20, memory_limit // (4 * in_flight))


def leaf_regions(leaf: LeafOut, budget: int) -> Iterator[Region]:
    """The output blocks of one array leaf, in order: whole output chunks (several when small),
    lined up with the source chunks when that fits (``aligned_block``)."""
    assert leaf.array is not None
    block = aligned_block(leaf.array.info, leaf.source_chunks, budget)
    return iter_blocks(leaf.array.info, block)


class Pipeline:
    """Blocks of many leaves in flight: source reads, then writes, under a byte budget."""

    def __init__(
        self,
        writer: ArraySink,
        jobs: list[tuple[LeafOut, Iterable[Region]]],
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        self.writer = writer
        self.jobs = jobs
        self.arrays = [leaf for leaf, _ in jobs]
        self.on_bytes = on_bytes
        self.depth = max(1, writer.in_flight // 2)
        self.budget = block_budget(writer.memory_limit, writer.in_flight)
        self.limit = max(self.budget, writer.memory_limit // 4)
        self.opens: dict[int, Any] = {}
        self.reads: deque[tuple[Any, Any, LeafOut, tuple[slice, ...], int]] = deque()
        self.writes: deque[tuple[Any, LeafOut, int]] = deque()
        self.held = 0

    def run(self) -> None:
        for i, (leaf, regions) in enumerate(self.jobs):
            assert leaf.array is not None and leaf.source is not None
            arr = self._opened(i)
            itemsize = dtype_itemsize(leaf.array.dtype)
            for region in regions:
                nbytes = math.prod(s.stop - s.start for s in region) * itemsize
                self.reads.append((leaf.source(region), arr, leaf, region, nbytes))
                self.held += nbytes
                while self.reads and (len(self.reads) > self.depth or self.held > self.limit):
                    self._start_write()
                while self.writes and (len(self.writes) > self.depth or self.held > self.limit):
                    self._finish_write()
        while self.reads:
            self._start_write()
        while self.writes:
            self._finish_write()

    def _opened(self, i: int) -> Any:
        # Create the next few arrays ahead: each create is a round trip of its own.
        for j in range(i, min(i + 32, len(self.arrays))):
            if j not in self.opens:
                self.opens[j] = self.writer.open_array(self.arrays[j])
        try:
            return self.opens.pop(i).result()
        except Exception as e:
            raise StorageError(
                f"cannot create leaf {self.arrays[i].name!r} in {self.writer.dest}: "
                f"{self.writer.dest.describe_error(e)}"
            ) from None

    def _start_write(self) -> None:
        import numpy as np

        fut, arr, leaf, region, nbytes = self.reads.popleft()
        try:
            values = fut.result() if hasattr(fut, "result") else fut
        except StorageError:
            raise
        except Exception as e:
            raise StorageError(
                f"cannot read the source of leaf {leaf.name!r}: {first_line(e)}"
            ) from None
        values = np.asarray(values)
        if values.dtype.name != arr.dtype.name:
            values = values.astype(arr.dtype.numpy_dtype)
        # A source that hands over fresh arrays (never modified afterwards) lets TensorStore
        # encode from them instead of copying each block first.
        if getattr(self.writer, "fresh_sources", False):
            write = arr[region].write(values, can_reference_source_data_indefinitely=True)
        else:
            write = arr[region].write(values)
        self.writes.append((write.commit, leaf, nbytes))

    def _finish_write(self) -> None:
        fut, leaf, nbytes = self.writes.popleft()
        try:
            fut.result()
        except Exception as e:
            dest = self.writer.dest
            raise StorageError(
                f"cannot write leaf {leaf.name!r} to {dest}: {dest.describe_error(e)}"
            ) from None
        self.held -= nbytes
        if self.on_bytes:
            self.on_bytes(nbytes)

    def drain_quietly(self) -> None:
        """Let TensorStore finish what it started before the caller deletes the tmp step: a
        write landing after the deletion would re-create the directory."""
        pending = (
            [f[0] for f in self.reads] + [f[0] for f in self.writes] + list(self.opens.values())
        )
        for fut in pending:
            if hasattr(fut, "result"):
                with contextlib.suppress(Exception):
                    fut.result()
