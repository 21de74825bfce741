"""Reading ``trend``'s leaves: a leaf's steps cut into segments (runs of one shape), each
segment into jobs (one per block read at every step, or one streaming the whole leaf), and the
jobs run on threads with their accumulators merged (``fold``). ``run.trend`` runs every job of
a plan here; ``distributed`` runs a unit's jobs on a worker.

A block is read at every step holding the leaf (TensorStore futures) and folded into an
accumulator per step, the previous step's copy of the block giving the update. Memory is bounded
by the jobs in flight times the block budget (``TrendOptions.block_bytes``, shared by a leaf's
steps; a block is summed as read by ``kernel.py``, or converted to float64 where numpy sums it),
whatever the leaf's or the checkpoint's size. A chunk larger than a step's block and within the
budget is held once per step in TensorStore's cache; a leaf whose chunks exceed the budget is
streamed as ``verify --deep`` streams it (``_stream``: a slab and a range read per step, one job
per leaf), where its layout allows (``chunkstream``), else held so in the cache.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo, LeafReader
from ckpt_cli.core.format.blocks import is_large, iter_blocks, stream_blocks
from ckpt_cli.core.format.scan import read_block, streamed_slabs
from ckpt_cli.core.threads import threads
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.types import TrendPlan
from ckpt_cli.errors import StorageError, first_line

#: Blocks in flight beyond one per thread (each block is read at every step of its leaf).
IN_FLIGHT = 2
#: The least a step's share of a block may be (many steps: smaller blocks, never tiny reads).
MIN_STEP_BLOCK = 256 << 10

Block = tuple[slice, ...]
#: One leaf at consecutive steps of one shape: (step, its array, its OCDBT database).
Segment = list[tuple[int, ArrayInfo, str]]
Job = Callable[[], list[Acc]]


def step_block(plan: TrendPlan) -> int:
    """Bytes of a step's share of a block: the block budget over the plan's steps."""
    return max(MIN_STEP_BLOCK, plan.options.block_bytes // max(1, len(plan.steps)))


def segments(plan: TrendPlan) -> list[tuple[str, Segment]]:
    """Every leaf's segments, in the plan's leaf order: (leaf name, segment)."""
    return [(leaf.name, seg) for leaf in plan.leaves for seg in _segments(leaf.at)]


def unchanged(plan: TrendPlan, name: str, seg: Segment) -> list[bool]:
    """Per step of a segment: whether its recorded digest of the leaf equals the previous
    step's (its values are that step's: not read)."""
    recorded = {r.step: r.digests for r in plan.steps}
    keys = [recorded[step].get(name) for step, _, _ in seg]
    return [i > 0 and k is not None and k == keys[i - 1] for i, k in enumerate(keys)]


def fold(
    jobs: Iterable[tuple[int, Iterable[Job]]],
    accs: list[list[Acc]],
    workers: int,
    finished: Callable[[int], None] = lambda i: None,
) -> None:
    """Run each segment's jobs (segment ``i``'s, ``i`` in order) on ``workers`` threads, at most
    ``workers + IN_FLIGHT`` at once, merging each job's accumulators into ``accs[i]`` in job
    order; ``finished(i)`` once every job of segment ``i`` is merged."""
    left: dict[int, int] = {}
    closed = -1  # segments whose every job is submitted
    with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-trend") as pool:
        pending: deque[tuple[int, Future[list[Acc]]]] = deque()

        def drain() -> None:
            i, fut = pending.popleft()
            accs[i] = [a.merge(b) for a, b in zip(accs[i], fut.result(), strict=True)]
            left[i] -= 1
            if not left[i] and i <= closed:
                finished(i)

        for i, seg_jobs in jobs:
            left.setdefault(i, 0)
            for job in seg_jobs:
                left[i] += 1
                pending.append((i, pool.submit(job)))
                if len(pending) >= workers + IN_FLIGHT:
                    drain()
            closed = i
            if not left[i]:
                finished(i)
        while pending:
            drain()


def _segments(at: tuple[tuple[int, ArrayInfo, str], ...]) -> list[Segment]:
    """Runs of consecutive steps whose array has one shape: updates are taken within a run."""
    out: list[Segment] = []
    for entry in at:
        if out and out[-1][-1][1].shape == entry[1].shape:
            out[-1].append(entry)
        else:
            out.append([entry])
    return out


def _blocks(readers: list[LeafReader], budget: int) -> Iterable[Block]:
    return blocks(readers[0].info, all(r.multi_chunk_blocks for r in readers), budget)


def blocks(info: ArrayInfo, multi_chunk: bool, budget: int) -> Iterator[Block]:
    """The blocks a segment of ``info``'s leaf is read in: of up to ``budget`` bytes, or one
    per chunk where a block may not span chunks (``multi_chunk`` False: an unmerged OCDBT
    item's reader)."""
    if multi_chunk:
        return stream_blocks(info, budget)
    return iter_blocks(info, info.chunk_shape)


def leaf_jobs(
    name: str,
    readers: list[LeafReader],
    same: list[bool],
    per_step: int,
    budget: int,
    done: Callable[[int], None],
    streaming: Streaming,
) -> Iterator[Job]:
    """The tasks reading a segment: one streaming the whole leaf (``_stream``) where its chunks
    exceed the block budget and stream here, else one per block."""
    slabs = _streams(readers, same, per_step, budget)
    if slabs is not None:
        yield functools.partial(_stream, name, readers[0].info, slabs, done, streaming)
        return
    yield from block_jobs(name, readers, same, _blocks(readers, per_step), done)


def block_jobs(
    name: str,
    readers: list[LeafReader],
    same: list[bool],
    cut: Iterable[Block],
    done: Callable[[int], None],
) -> Iterator[Job]:
    """One task per block of ``cut``, reading it at every step of the segment (``_block``)."""
    for block in cut:
        yield functools.partial(_block, name, readers, same, block, done)


Slabs = Iterator[tuple[Any, Any]]


class Streaming:
    """What a run's streaming tasks share: ``stop``, set on the way out (Ctrl-C: they end at
    their next slab), and ``slots``: how many stream at once (every core busy with the steps of
    ``threads() // steps`` leaves, one at least), so memory is a slab and a range read per step
    of those leaves, not of every leaf in flight."""

    def __init__(self, slots: int) -> None:
        self.stop = threading.Event()
        self.slots = threading.Semaphore(slots)

    @contextlib.contextmanager
    def ending(self) -> Iterator[None]:
        """Set ``stop`` when the block ends, however it ends."""
        try:
            yield
        finally:
            self.stop.set()


def _streams(
    readers: list[LeafReader], same: list[bool], per_step: int, budget: int
) -> list[Slabs | None] | None:
    """Per step of a segment whose chunks exceed ``budget``: its slabs of ``per_step`` bytes,
    streamed here as ``verify --deep`` streams them (``chunkstream``: range reads, zstd decoded
    as a stream), or None for a step not read (``same``); None when a step cannot stream or the
    steps' chunks differ (TensorStore reads the segment)."""
    first = readers[0].info
    if not is_large(first, budget):
        return None
    out: list[Slabs | None] = []
    for reader, s in zip(readers, same, strict=True):
        info = reader.info
        if s:
            out.append(None)
            continue
        if info.chunk_shape != first.chunk_shape or info.dtype != first.dtype:
            return None
        slabs = streamed_slabs(info, reader, per_step)
        if slabs is None:
            return None
        out.append(slabs)
    return out


def _stream(
    name: str,
    info: ArrayInfo,
    slabs: list[Slabs | None],
    done: Callable[[int], None],
    streaming: Streaming,
) -> list[Acc]:
    """A leaf streamed at every step of a segment together, slab by slab (the steps' slabs
    line up: one shape, one chunking): its accumulators, as ``_block``'s. The steps decode and
    count on up to ``threads()`` threads of their own (a leaf saved whole from one device is
    one chunk: one task). Memory: a slab and a range read per step, whatever the chunk's size.
    It waits for one of ``streaming.slots``; once ``streaming.stop`` is set (the run is
    abandoned: Ctrl-C) it ends at the next slab, its figures then partial, and never used."""
    units = info.shape[-1] if len(info.shape) >= 2 else None
    accs = [Acc() for _ in slabs]
    read = [(i, s) for i, s in enumerate(slabs) if s is not None]
    parts: list[Any] = []

    def fold(k: int) -> None:
        origin, x = parts[k]
        cols = (units, slice(origin[-1], origin[-1] + x.shape[-1])) if units else None
        accs[read[k][0]].add(x, parts[k - 1][1] if k else None, cols)

    ways = min(len(read), max(1, threads()))
    try:
        with (
            streaming.slots,
            ThreadPoolExecutor(ways, thread_name_prefix="ckpt-trend-steps") as steps,
        ):
            while (
                not streaming.stop.is_set()
                and (parts := list(steps.map(_next, read)))[0] is not None
            ):
                list(steps.map(fold, range(len(read))))
                done(sum(x.nbytes for _, x in parts))
    except Exception as e:
        raise _unreadable(name, e) from None
    finally:
        parts.clear()
        for _, s in read:
            getattr(s, "close", lambda: None)()
    for i, step_slabs in enumerate(slabs):
        if step_slabs is None:  # the step before's values: its figures, no update
            accs[i] = accs[i - 1].again()
            done(info.nbytes)
    return accs


def _next(step: tuple[int, Slabs]) -> Any:
    return next(step[1], None)


def _block(
    name: str,
    readers: list[LeafReader],
    same: list[bool],
    block: Block,
    done: Callable[[int], None],
) -> list[Acc]:
    """One block of a leaf at every step of a segment: its accumulators (the update against
    the step before within the segment). A step whose values are the step before's (``same``)
    is not read: its accumulator is that step's, with no update."""
    futures = [None if s else read_block(r, block) for r, s in zip(readers, same, strict=True)]
    nbytes = math.prod(s.stop - s.start for s in block) * readers[0].info.itemsize
    shape = readers[0].info.shape
    units = (shape[-1], block[-1]) if len(shape) >= 2 else None
    out: list[Acc] = []
    prev = None
    for fut in futures:
        if fut is None:
            out.append(out[-1].again())
            done(nbytes)
            continue
        try:
            x = fut.result()
        except Exception as e:
            raise _unreadable(name, e) from None
        acc = Acc()
        acc.add(x, prev, units)
        out.append(acc)
        prev = x
        done(nbytes)
    return out


class LeafUnreadable(StorageError):
    """A leaf's values could not be read at some step (``leaf``: its name)."""

    def __init__(self, leaf: str, message: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.leaf = leaf


def _unreadable(name: str, e: Exception) -> StorageError:
    return LeafUnreadable(
        name,
        f"cannot read leaf {name!r}: {first_line(e)}",
        hint="run `ckpt verify --deep` on the step",
    )
