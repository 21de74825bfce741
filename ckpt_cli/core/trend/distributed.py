"""``trend`` over units on an executor (``--workers``, ``--executor dask``): the workers read and
count, the driver only merges the accumulators and judges the figures.

A unit is a list of parts, each a segment of a leaf (the leaf at consecutive steps of one shape,
``read.segments``) or a run of its blocks: small segments share a unit up to ``--unit-bytes``, a
segment larger than that is cut into runs of the blocks a single process reads it in
(``read.blocks``, the same cut: the same per-block sums), each run a unit. A leaf whose chunks
exceed the block budget is one part, read by one worker as a single process reads it (streamed
slab by slab where its layout allows). A worker runs a unit's blocks as the single process
runs a plan's (``read.fold``), on its share of the threads (``threads() // UNITS_PER_WORKER``:
each worker process runs that many units at once), so a worker holds no more blocks than one
process reading alone.

Merging is exact (``accum.Acc``: the sums are kept as exact partials, counts are integers,
``max_abs`` a maximum and the units' flags an OR), and the driver merges in unit order: the
figures are the same bits on 1 or N workers, whatever the unit size and whichever unit ends
first.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ckpt_cli.core.executor import Executor, ExecutorSpec, decline, open_executor
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, cached_context
from ckpt_cli.core.format.blocks import cache_bytes, is_large
from ckpt_cli.core.scale import Scale
from ckpt_cli.core.split import should_split
from ckpt_cli.core.storage import StorageOptions, open_location
from ckpt_cli.core.threads import threads
from ckpt_cli.core.trend import read
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.types import TrendPlan
from ckpt_cli.core.workers import UNITS_PER_WORKER


@dataclass(frozen=True)
class StepSource:
    """Where a worker opens one step's item."""

    step: int
    item: str  # URL of the item directory
    zarr3: bool
    storage: StorageOptions = field(default_factory=StorageOptions)


@dataclass(frozen=True)
class Part:
    """A segment of a leaf (``segment``: its index in the plan's segments), or a run of its
    blocks (``blocks``; None: all of them, or the whole leaf streamed)."""

    segment: int
    name: str
    at: tuple[tuple[int, ArrayInfo, str], ...]  # (step, its array, its OCDBT database)
    same: tuple[bool, ...]  # per step: the step before's values (recorded digests): not read
    blocks: tuple[read.Block, ...] | None
    nbytes: int  # array bytes of the part at all its steps (progress)


@dataclass(frozen=True)
class TrendUnit:
    run: str  # the run the unit belongs to: a worker reuses the steps' opened stores for it
    steps: tuple[StepSource, ...]
    parts: tuple[Part, ...]
    per_step: int  # a step's share of a block (``read.step_block``)
    budget: int  # the block budget (``TrendOptions.block_bytes``)
    cache: int  # bytes of the chunk cache one process reading the plan opens the steps with

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


@dataclass(frozen=True)
class TrendDone:
    parts: tuple[tuple[int, list[Acc]], ...]  # (segment, its accumulators per step)
    nbytes: int
    seconds: float = 0.0  # spent in the unit, on its worker


def read_scaled(
    plan: TrendPlan,
    segs: list[tuple[str, read.Segment]],
    same: list[list[bool]],
    executor: Executor | ExecutorSpec,
    unit_bytes: int,
    done: Callable[[int], None],
) -> tuple[list[list[Acc]] | None, Scale]:
    """Every segment's accumulators, read in units on ``executor``'s workers; None (read
    here) when a spec's split does not pay, with the scale saying why."""
    with contextlib.ExitStack() as stack:
        pool, scale = _executor(stack, executor, plan)
        if pool is None:
            return None, scale
        units = plan_units(plan, segs, same, unit_bytes)
        results = pool.map(run_unit, units, lambda d: done(d.nbytes))
    accs = [[Acc() for _ in seg] for _, seg in segs]
    for result in results:  # in unit order (the merge is exact: any order, the same bits)
        for i, part in result.parts:
            accs[i] = [a.merge(b) for a, b in zip(accs[i], part, strict=True)]
    seconds = sum(r.seconds for r in results)
    return accs, replace(scale, units=len(results), worker_seconds=seconds)


def _executor(
    stack: contextlib.ExitStack, executor: Executor | ExecutorSpec, plan: TrendPlan
) -> tuple[Executor | None, Scale]:
    """The executor the run reads on (entered on ``stack``), or None where a spec's split does
    not pay (its early-started workers released)."""
    if isinstance(executor, Executor):
        return executor, Scale(executor.name, executor.workers)
    from ckpt_cli.core.storage.remote import RemoteLocation

    remote = isinstance(plan.steps[0].ref.location, RemoteLocation)
    decision = should_split(executor, plan.nbytes, remote=remote, reads_only=True)
    if not decision.split:
        decline(executor)
        return None, Scale(executor.kind, executor.workers, split=False, reason=decision.reason)
    pool = stack.enter_context(open_executor(executor))
    return pool, Scale(pool.name, pool.workers)


def plan_units(
    plan: TrendPlan, segs: list[tuple[str, read.Segment]], same: list[list[bool]], unit_bytes: int
) -> Iterator[TrendUnit]:
    """The plan's units, yielded as they are cut (the executor submits each at once)."""
    budget, per_step = plan.options.block_bytes, read.step_block(plan)
    infos = [info for leaf in plan.leaves for _, info, _ in leaf.at]
    base = TrendUnit(
        uuid.uuid4().hex,
        tuple(
            StepSource(r.step, str(r.ref.location), r.zarr3, r.ref.location.options)
            for r in plan.steps
        ),
        (),
        per_step,
        budget,
        cache_bytes(infos, per_step) * len(plan.steps),
    )
    multi = _MultiChunk(plan)
    parts: list[Part] = []
    size = 0
    for i, (name, seg) in enumerate(segs):
        at, first = tuple(seg), seg[0][1]
        nbytes = sum(info.nbytes for _, info, _ in seg)
        if nbytes <= unit_bytes or is_large(first, budget):
            parts.append(Part(i, name, at, tuple(same[i]), None, nbytes))
            size += nbytes
            if size >= unit_bytes:
                yield replace(base, parts=tuple(parts))
                parts, size = [], 0
            continue
        cut = read.blocks(first, multi(seg), per_step)
        for run, run_bytes in _runs(cut, first.itemsize * len(seg), unit_bytes):
            yield replace(base, parts=(Part(i, name, at, tuple(same[i]), run, run_bytes),))
    if parts:
        yield replace(base, parts=tuple(parts))


def _runs(
    cut: Iterator[read.Block], bytes_per_value: int, unit_bytes: int
) -> Iterator[tuple[tuple[read.Block, ...], int]]:
    """Consecutive blocks of ``cut`` grouped into runs of up to ``unit_bytes`` (one block at
    least), each with its bytes."""
    run: list[read.Block] = []
    size = 0
    for block in cut:
        nbytes = bytes_per_value
        for s in block:
            nbytes *= s.stop - s.start
        if run and size + nbytes > unit_bytes:
            yield tuple(run), size
            run, size = [], 0
        run.append(block)
        size += nbytes
    if run:
        yield tuple(run), size


class _MultiChunk:
    """Whether a segment's blocks may span chunks at every step (``ItemStore``'s readers),
    the steps' items listed once each."""

    def __init__(self, plan: TrendPlan) -> None:
        self.reads = {r.step: r for r in plan.steps}
        self.known: dict[int, bool] = {}

    def __call__(self, seg: read.Segment) -> bool:
        for step, _, _ in seg:
            if step not in self.known:
                r = self.reads[step]
                self.known[step] = ItemStore(r.ref.location, r.zarr3).multi_chunk_blocks
        return all(self.known[step] for step, _, _ in seg)


def run_unit(unit: TrendUnit) -> TrendDone:
    """Read a unit's parts on this worker's share of threads: each part's accumulators."""
    started = time.monotonic()
    sources = {s.step: s for s in unit.steps}
    ways = max(1, threads() // UNITS_PER_WORKER)
    streaming = read.Streaming(max(1, ways // max(1, len(unit.steps))))
    accs = [[Acc() for _ in p.at] for p in unit.parts]

    def jobs(k: int) -> Iterator[read.Job]:
        p = unit.parts[k]
        readers = [_store(unit, sources[step]).reader(p.name, info, db) for step, info, db in p.at]
        same = list(p.same)
        if p.blocks is None:
            return read.leaf_jobs(
                p.name, readers, same, unit.per_step, unit.budget, _uncounted, streaming
            )
        return read.block_jobs(p.name, readers, same, p.blocks, _uncounted)

    with streaming.ending():
        read.fold(((k, jobs(k)) for k in range(len(unit.parts))), accs, ways)
    parts = tuple((p.segment, a) for p, a in zip(unit.parts, accs, strict=True))
    return TrendDone(parts, unit.nbytes, time.monotonic() - started)


def _uncounted(nbytes: int) -> None:
    """Progress on a worker: the driver counts the unit's bytes when it is done."""


#: Opened stores a worker keeps, by run and step: a run's units after the first skip the
#: listing, the OCDBT manifest and the headers. Keyed by run: a later run sees changed steps.
#: Only the latest ``_KEPT_RUNS`` runs' stores (and chunk caches) are kept.
_STORES: dict[str, dict[int, ItemStore]] = {}
_STORES_LOCK = threading.Lock()
_KEPT_RUNS = 2


def _store(unit: TrendUnit, source: StepSource) -> ItemStore:
    with _STORES_LOCK:
        if unit.run not in _STORES:
            while len(_STORES) >= _KEPT_RUNS:
                del _STORES[next(iter(_STORES))]
            _STORES[unit.run] = {}
        stores = _STORES[unit.run]
        if source.step not in stores:
            context = next((s.context for s in stores.values()), None)
            if context is None and unit.cache:  # the units running at once each walk chunks
                context = cached_context(unit.cache * UNITS_PER_WORKER)
            location = open_location(source.item, source.storage)
            stores[source.step] = ItemStore(location, source.zarr3, context)
        return stores[source.step]
