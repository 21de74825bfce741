"""What a scan is asked of one leaf (``ScanTask``), gathers of it (``Acc``) and tells of it
(``LeafScan``): NaN and Inf counts, the C-order SHA-256, the ``ld1`` partial of the blocks
read, bytes and blocks.

A leaf streamed as several chunk jobs at once (``scan._stream_jobs``) has an ``Acc`` per job,
each with its own ``ld1`` stream starting where its chunk starts in the leaf's C-order stream;
the leaf's ``Acc`` takes each job's once it is done (``absorb``): counts added, partials merged
(``ld1`` is a sum over positions, so the parts' partials merge into the leaf's whatever the
order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckpt_cli.core.digest.ld1 import Partial, merge
from ckpt_cli.core.digest.ld1_stream import Stream
from ckpt_cli.core.digest.records import ValueHasher
from ckpt_cli.core.format.dtypes import all_finite
from ckpt_cli.core.threads import threads

if TYPE_CHECKING:
    from ckpt_cli.core.format.arrays import ArrayInfo

_FLOAT_PREFIXES = ("bfloat16", "float")

Block = tuple[slice, ...]


@dataclass(frozen=True)
class ScanTask:
    """One leaf to read: all of it (``blocks`` None) or the given blocks."""

    name: str
    info: ArrayInfo
    database: str = ""
    digest: bool = False  # hash the values (needs the whole leaf, read in C order)
    ld1: bool = False  # the ``ld1`` partial of the blocks read (any order, any blocks)
    blocks: tuple[Block, ...] | None = None
    #: Read only blocks ``start`` <= i < ``stop`` of the leaf's block sequence (a budgeted run
    #: resuming where the last one stopped); a digest needs the whole range.
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True)
class LeafScan:
    name: str
    nan: int
    inf: int
    digest: str | None
    error: str | None
    bytes: int
    blocks: int
    #: Every block of the task's range was read (False: the budget stopped it at ``next_block``).
    complete: bool = True
    next_block: int | None = None
    #: ``ld1`` of the blocks read (a partial: a leaf split over units merges them, ``ld1_of``).
    partial: Partial | None = None


def _is_float(dtype_name: str) -> bool:
    return dtype_name.startswith(_FLOAT_PREFIXES)


class Acc:
    """One leaf's counts and hashes, or those of one chunk job of it (``stream_start``: the
    byte where the job's values begin in the leaf's C-order stream; None: no ``ld1`` stream,
    every block hashed as a box)."""

    def __init__(self, task: ScanTask, stream_start: int | None = 0) -> None:
        self.task = task
        self.hasher = ValueHasher() if task.digest else None
        info = task.info
        self.ld1 = Partial(info.dtype, info.shape, info.nbytes) if task.ld1 else None
        # Slabs that arrive in C order (a streamed leaf): one kernel call each, no merge.
        self.stream = (
            Stream(info.dtype, info.shape, info.itemsize, stream_start)
            if task.ld1 and stream_start is not None
            else None
        )
        self.check_finite = _is_float(task.info.dtype)
        self.nan = 0
        self.inf = 0
        self.error: str | None = None
        self.bytes = 0
        self.blocks = 0
        self.next_block: int | None = None  # where a stopped leaf resumes

    def add(self, block: Any, origin: tuple[int, ...]) -> None:
        import numpy as np

        x = np.asarray(block)
        if self.ld1 is not None and not self._streamed(origin, x):
            from ckpt_cli.core.digest.ld1_threads import partial_threaded

            box = partial_threaded(origin, x, self.task.info.shape, self.task.info.dtype)
            self.ld1 = merge([self.ld1, box])
        if self.check_finite and not all_finite(x):
            finite = np.isfinite(x)
            nan = int(np.count_nonzero(np.isnan(x)))
            self.nan += nan
            self.inf += int(x.size - np.count_nonzero(finite)) - nan
        if self.hasher is not None:
            self.hasher.update(x)

    def _streamed(self, origin: tuple[int, ...], x: Any) -> bool:
        """Whether the stream took the block (one that ``ld1_threads`` would not cut)."""
        from ckpt_cli.core.digest.ld1_threads import pieces_for

        if self.stream is None or pieces_for(x.nbytes, threads()) > 1:
            return False
        return self.stream.add(origin, x)

    def result(self) -> LeafScan:
        if self.ld1 is not None and self.stream is not None and self.stream.taken:
            self.ld1 = merge([self.ld1, self.stream.partial()])
            self.stream = None
        whole = self.next_block is None and self.task.start == 0 and self.task.stop is None
        digest = self.hasher.hexdigest() if self.hasher and self.error is None and whole else None
        return LeafScan(
            self.task.name,
            self.nan,
            self.inf,
            digest,
            self.error,
            self.bytes,
            self.blocks,
            self.next_block is None,
            self.next_block,
            self.ld1 if self.error is None else None,
        )

    def absorb(self, part: Acc) -> None:
        """Take a finished chunk job's counts and ``ld1`` partial into this leaf's."""
        scan = part.result()
        self.nan += scan.nan
        self.inf += scan.inf
        self.bytes += scan.bytes
        self.blocks += scan.blocks
        if self.error is None and scan.error is not None:
            self.error = scan.error
        if self.ld1 is not None and scan.partial is not None:
            self.ld1 = merge([self.ld1, scan.partial])
