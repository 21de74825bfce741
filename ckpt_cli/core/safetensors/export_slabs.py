"""Export's tensors read as ``verify --deep`` reads them: a leaf (or a cast of one) whose chunks
are large (``tensor_slab``: 2 MiB or more), streamed chunk by chunk and slab by slab
(``scan.streamed_slabs``: range reads, zstd decoded as a stream into each slab's buffer), one
job per tensor on a pool of threads.

TensorStore decodes a chunk whole for every read that touches it, on its own pool, and a
tensor saved from one device is one chunk of tens of MiB: export then waited on a few whole
decodes at a time. Here each job reads, decodes, casts, takes the ``ld1`` partial of and
writes its tensor's slabs at their offsets in the file, on its own thread (none holds the GIL
for long: zstd, numpy, the compiled ``ld1`` kernel and ``pwrite`` release it), so as many
tensors stream at once as there are jobs. The jobs write in no particular order, so a file
they write to goes through the page cache (``SafetensorsWriter.share``), not direct writes.

Memory: a running job holds one slab, its cast and its read range (``chunkstream.
RANGE_BYTES``); ``jobs_for`` sizes the pool to half the memory limit. Jobs queued hold
nothing (their slabs are read lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ckpt_cli.core.digest.ld1 import Partial
from ckpt_cli.core.spec import ops
from ckpt_cli.core.write.finite import check_finite

#: Slabs of a streamed tensor: large enough that Python's work per slab is noise, small
#: enough that every thread holds one under the memory limit.
MIN_SLAB = 1 << 20
MAX_SLAB = 8 << 20


def slab_bytes(limit: int, threads: int) -> int:
    """Bytes of one slab when ``threads`` jobs share ``limit`` bytes of blocks in flight."""
    return max(MIN_SLAB, min(MAX_SLAB, limit // (2 * max(1, threads))))


def tensor_slab(slab: int, chunk_bytes: int) -> int | None:
    """The slab a tensor is streamed in: the command's ``slab`` for chunks larger than it;
    half a chunk for chunks of two minimum slabs up to ``slab`` (so whether a tensor streams
    does not hang on the thread count or the memory limit: 8 MiB chunks of a sharded save went
    through TensorStore's ordered blocks at 4 threads or 1 GiB, 1.5 cores, 7 s for 2 GiB on
    the 13-core host, and streamed at 8 threads, 3.5 s); None: chunks too small to pay."""
    if chunk_bytes > slab:
        return slab
    if chunk_bytes >= 2 * MIN_SLAB:
        return chunk_bytes // 2
    return None


def job_bytes(slab: int) -> int:
    """What a running job holds at most: a slab, its cast and its read range."""
    from ckpt_cli.core.format.chunkread import RANGE_BYTES

    return 2 * slab + RANGE_BYTES


def jobs_for(memory_limit: int, slab: int, threads: int) -> int:
    """Jobs running at once: at most ``threads``, all within half the memory limit (one at
    least)."""
    return max(1, min(threads, (memory_limit // 2) // job_bytes(slab)))


def cast_chain(expr: ops.Node) -> tuple[ops.Source, list[ops.Cast]] | None:
    """The source leaf and the casts (innermost first) when ``expr`` is only casts of a whole
    leaf; None for anything else (slices, transposes, concatenations...)."""
    casts: list[ops.Cast] = []
    while isinstance(expr, ops.Cast):
        casts.append(expr)
        expr = expr.inner
    if not isinstance(expr, ops.Source) or expr.shape != expr.info.shape:
        return None
    return expr, casts[::-1]


class SlabJob:
    """One tensor: its slabs read, cast, hashed and written on a pool thread (``run``)."""

    def __init__(
        self,
        name: str,
        slabs: Iterator[tuple[tuple[int, ...], Any]],
        casts: list[ops.Cast],
        shape: tuple[int, ...],
        dtype: str,
        ld1: bool,
        finite_label: str | None = None,
    ) -> None:
        self.name = name
        self._finite_label = finite_label  # NaN/Inf refused (``write.finite``)
        self._slabs = slabs
        self._casts = casts
        self._shape = shape
        self._dtype = dtype
        self._ld1 = ld1
        self.cancelled = False

    def run(
        self,
        write: Callable[[str, tuple[int, ...], Any], None],
        on_bytes: Callable[[int], None] | None,
    ) -> Partial | None:
        """Every slab written with ``write(name, origin, block)``; the tensor's ``ld1``
        partial (None when not asked for). Stops at the next slab once ``cancelled``."""
        import numpy as np

        from ckpt_cli.core.digest.ld1 import merge, partial
        from ckpt_cli.core.safetensors.dtypes import numpy_dtype

        want = numpy_dtype(self._dtype)
        found: Partial | None = None
        try:
            for origin, values in self._slabs:
                if self.cancelled:
                    return None
                for cast in self._casts:
                    values = cast._cast(values)
                block = np.ascontiguousarray(values, want)
                check_finite(self.name, self._finite_label, block)
                if self._ld1:
                    box = partial(origin, block, self._shape, self._dtype)
                    found = box if found is None else merge([found, box])
                write(self.name, origin, block)
                if on_bytes is not None:
                    on_bytes(block.nbytes)
        finally:
            close = getattr(self._slabs, "close", None)
            if close is not None:
                close()  # the chunk reader's file or stream, at once
        return found
