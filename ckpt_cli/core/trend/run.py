"""Run ``trend``: every leaf of the plan, block by block, all its steps read together.

A leaf's blocks are cut from its first step's array; one task reads a block at every step
holding the leaf (TensorStore futures) and folds each into an accumulator, the previous step's
copy of the block giving the update. Tasks of all leaves run on ``threads()`` workers, at most
``threads() + IN_FLIGHT`` at once, and their accumulators merge in float64 (``accum.Acc``), so
one large leaf uses every core. Each selected step is read once, and memory is bounded by the
tasks in flight times the block budget (``TrendOptions.block_bytes``, shared by a leaf's steps;
a block is summed as read by ``kernel.py``, or converted to float64 where numpy sums it),
whatever the leaf's or the checkpoint's size. A chunk larger than a step's block and within
the budget is held once per step in TensorStore's cache; a leaf whose chunks exceed the budget
is streamed as ``verify --deep`` streams it (``_stream``: a slab and a range read per step, one
task per leaf), where its layout allows (``chunkstream``), else held so in the cache."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader, cached_context
from ckpt_cli.core.format.blocks import cache_bytes, is_large, iter_blocks, stream_blocks
from ckpt_cli.core.format.scan import read_block, streamed_slabs
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.threads import threads
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.findings import findings
from ckpt_cli.core.trend.types import LeafPlan, LeafTrend, StepStats, TrendPlan, TrendReport
from ckpt_cli.errors import StorageError, first_line

#: Blocks in flight beyond one per thread (each block is read at every step of its leaf).
IN_FLIGHT = 2
#: The least a step's share of a block may be (many steps: smaller blocks, never tiny reads).
MIN_STEP_BLOCK = 256 << 10

Block = tuple[slice, ...]


def trend(plan: TrendPlan, on_progress: ProgressFn | None = None) -> TrendReport:
    """Read every leaf of ``plan`` at every step (progress as ``trend`` bytes) and return the
    figures, the run's metrics and the findings."""
    budget = plan.options.block_bytes
    per_step = max(MIN_STEP_BLOCK, budget // max(1, len(plan.steps)))
    infos = [info for leaf in plan.leaves for _, info, _ in leaf.at]
    # A chunk larger than a step's block is decoded once into the cache, for all its slabs.
    cache = cache_bytes(infos, per_step) * len(plan.steps)
    context = cached_context(cache) if cache else None
    stores = {r.step: ItemStore(r.ref.location, r.zarr3, context) for r in plan.steps}
    done = ByteProgress(on_progress, "trend", plan.nbytes)
    segments = [
        (leaf, seg, [stores[step].reader(leaf.name, info, db) for step, info, db in seg])
        for leaf in plan.leaves
        for seg in _segments(leaf.at)
    ]
    recorded = {r.step: r.digests for r in plan.steps}
    same = [_unchanged(leaf.name, seg, recorded) for leaf, seg, _ in segments]
    accs = [[Acc() for _ in seg] for _, seg, _ in segments]
    dead: list[list[tuple[int, int] | None]] = [[None] * len(seg) for _, seg, _ in segments]
    left = [0] * len(segments)  # blocks of a segment submitted and not yet merged
    submitted = 0  # segments whose every block is submitted
    workers = max(1, threads())
    streaming = _Streaming(max(1, workers // max(1, len(plan.steps))))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-trend") as pool, streaming.ending():
        pending: deque[tuple[int, Future[list[Acc]]]] = deque()

        def drain() -> None:
            i, fut = pending.popleft()
            accs[i] = [a.merge(b) for a, b in zip(accs[i], fut.result(), strict=True)]
            left[i] -= 1
            if not left[i] and i < submitted:  # every block merged: units counted, freed
                dead[i] = _dead_units(accs[i])

        for i, (leaf, _, readers) in enumerate(segments):
            for job in _jobs(leaf.name, readers, same[i], per_step, budget, done, streaming):
                left[i] += 1
                pending.append((i, pool.submit(job)))
                if len(pending) >= workers + IN_FLIGHT:
                    drain()
            submitted = i + 1
            if not left[i]:
                dead[i] = _dead_units(accs[i])
        while pending:
            drain()
    leaves = _rows(plan, segments, accs, dead)
    metrics = tuple((r.step, r.metrics) for r in plan.steps if r.metrics)
    report = TrendReport(
        plan.root,
        plan.item,
        tuple(r.step for r in plan.steps),
        leaves,
        metrics,
        (),
        plan.options,
        sum(sum(s) for s in same),
    )
    return replace(report, findings=findings(report))


Segment = list[tuple[int, ArrayInfo, str]]


def _dead_units(accs: list[Acc]) -> list[tuple[int, int] | None]:
    """Per step of a segment: (units all 0, units all 0 that were not at the step before), or
    None for a leaf of fewer than two dimensions; the units' flags are dropped."""
    out: list[tuple[int, int] | None] = []
    before = None
    for acc in accs:
        alive, acc.alive = acc.alive, None
        if alive is None:
            out.append(None)
            continue
        died = 0 if before is None else int((before & ~alive).sum())
        out.append((int(alive.size - alive.sum()), died))
        before = alive
    return out


def _rows(
    plan: TrendPlan,
    segments: list[tuple[LeafPlan, Segment, list[LeafReader]]],
    accs: list[list[Acc]],
    dead: list[list[tuple[int, int] | None]],
) -> tuple[LeafTrend, ...]:
    rows: dict[str, list[StepStats]] = {leaf.name: [] for leaf in plan.leaves}
    for (leaf, seg, _), seg_accs, seg_dead in zip(segments, accs, dead, strict=True):
        prev_norm: float | None = None
        for i, ((step, _, _), acc) in enumerate(zip(seg, seg_accs, strict=True)):
            units = seg_dead[i]
            upd = acc.update if i else None
            upd_norm = math.sqrt(upd) if upd is not None else None
            ratio = upd_norm / prev_norm if upd_norm is not None and prev_norm else None
            rows[leaf.name].append(
                StepStats(
                    step,
                    acc.norm,
                    acc.rms,
                    acc.max_abs,
                    acc.mean,
                    acc.zero_fraction,
                    acc.nonfinite,
                    upd_norm,
                    ratio,
                    None if units is None else units[0],
                    None if units is None or not i else units[1],
                )
            )
            prev_norm = acc.norm
    return tuple(
        LeafTrend(leaf.name, leaf.part, leaf.dtype, leaf.shape, tuple(rows[leaf.name]))
        for leaf in plan.leaves
    )


def _unchanged(name: str, seg: Segment, recorded: dict[int, dict[str, str]]) -> list[bool]:
    """Per step of a segment: whether its recorded digest of the leaf equals the previous
    step's (its values are that step's: not read)."""
    keys = [recorded[step].get(name) for step, _, _ in seg]
    return [i > 0 and k is not None and k == keys[i - 1] for i, k in enumerate(keys)]


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
    first = readers[0].info
    if all(r.multi_chunk_blocks for r in readers):
        return stream_blocks(first, budget)
    return iter_blocks(first, first.chunk_shape)


def _jobs(
    name: str,
    readers: list[LeafReader],
    same: list[bool],
    per_step: int,
    budget: int,
    done: Callable[[int], None],
    streaming: _Streaming,
) -> Iterator[Callable[[], list[Acc]]]:
    """The tasks reading a segment: one streaming the whole leaf (``_stream``) where its chunks
    exceed the block budget and stream here, else one per block."""
    slabs = _streams(readers, same, per_step, budget)
    if slabs is not None:
        yield functools.partial(_stream, name, readers[0].info, slabs, done, streaming)
        return
    for block in _blocks(readers, per_step):
        yield functools.partial(_block, name, readers, same, block, done)


Slabs = Iterator[tuple[Any, Any]]


class _Streaming:
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
    streaming: _Streaming,
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
            accs[i] = replace(accs[i - 1], update=0.0, alive=_copy(accs[i - 1].alive))
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
            out.append(replace(out[-1], update=0.0, alive=_copy(out[-1].alive)))
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


def _unreadable(name: str, e: Exception) -> StorageError:
    return StorageError(
        f"cannot read leaf {name!r}: {first_line(e)}", hint="run `ckpt verify --deep` on the step"
    )


def _copy(alive: Any) -> Any:
    return None if alive is None else alive.copy()
