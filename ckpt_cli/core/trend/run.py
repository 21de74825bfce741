"""Run ``trend``: every leaf of the plan, block by block, all its steps read together.

A leaf's blocks are cut from its first step's array; each block is read at every step holding
the leaf (TensorStore futures, ``IN_FLIGHT`` blocks ahead) and folded into the step's
accumulator, the previous step's copy of the block giving the update. Each selected step is read
once, and a leaf holds at most ``IN_FLIGHT x`` its block budget (``TrendOptions.block_bytes``,
shared by its steps) whatever its size. Leaves run on ``threads()`` workers; their
accumulators merge in float64 (``accum.Acc``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader, cached_context
from ckpt_cli.core.format.blocks import cache_bytes, iter_blocks, stream_blocks
from ckpt_cli.core.format.scan import read_block
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.threads import threads
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.findings import findings
from ckpt_cli.core.trend.types import LeafPlan, LeafTrend, StepStats, TrendPlan, TrendReport
from ckpt_cli.errors import StorageError, first_line

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

    def one(leaf: LeafPlan) -> LeafTrend:
        return _leaf(leaf, stores, per_step, done)

    workers = max(1, min(threads(), len(plan.leaves)))
    if workers == 1:
        leaves = [one(leaf) for leaf in plan.leaves]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="ckpt-trend") as pool:
            leaves = list(pool.map(one, plan.leaves))
    metrics = tuple((r.step, r.metrics) for r in plan.steps if r.metrics)
    report = TrendReport(
        plan.root,
        plan.item,
        tuple(r.step for r in plan.steps),
        tuple(leaves),
        metrics,
        (),
        plan.options,
    )
    from dataclasses import replace

    return replace(report, findings=findings(report))


def _leaf(
    leaf: LeafPlan, stores: dict[int, ItemStore], budget: int, done: Callable[[int], None]
) -> LeafTrend:
    rows: list[StepStats] = []
    for segment in _segments(leaf.at):
        readers = [stores[step].reader(leaf.name, info, db) for step, info, db in segment]
        accs = _read_segment(leaf.name, readers, budget, done)
        prev_norm: float | None = None
        for (step, _, _), acc in zip(segment, accs, strict=True):
            upd = acc.update_norm
            ratio = upd / prev_norm if upd is not None and prev_norm else None
            rows.append(
                StepStats(
                    step,
                    acc.norm,
                    acc.rms,
                    acc.max_abs,
                    acc.mean,
                    acc.zero_fraction,
                    acc.nonfinite,
                    upd,
                    ratio,
                )
            )
            prev_norm = acc.norm
    return LeafTrend(leaf.name, leaf.part, leaf.dtype, leaf.shape, tuple(rows))


def _segments(
    at: tuple[tuple[int, ArrayInfo, str], ...],
) -> list[list[tuple[int, ArrayInfo, str]]]:
    """Runs of consecutive steps whose array has one shape: updates are taken within a run."""
    out: list[list[tuple[int, ArrayInfo, str]]] = []
    for entry in at:
        if out and out[-1][-1][1].shape == entry[1].shape:
            out[-1].append(entry)
        else:
            out.append([entry])
    return out


def _read_segment(
    name: str, readers: list[LeafReader], budget: int, done: Callable[[int], None]
) -> list[Acc]:
    accs = [Acc() for _ in readers]
    first = readers[0]
    blocks: Iterable[Block]
    if all(r.multi_chunk_blocks for r in readers):
        blocks = stream_blocks(first.info, budget)
    else:
        blocks = iter_blocks(first.info, first.info.chunk_shape)
    pending: deque[tuple[int, list[Any]]] = deque()

    def drain() -> None:
        nbytes, futures = pending.popleft()
        prev = None
        for acc, fut in zip(accs, futures, strict=True):
            try:
                x = fut.result()
            except Exception as e:
                raise StorageError(
                    f"cannot read leaf {name!r}: {first_line(e)}",
                    hint="run `ckpt verify --deep` on the step",
                ) from None
            acc.add(x, prev)
            prev = x
            done(nbytes)

    for block in blocks:
        nbytes = math.prod(s.stop - s.start for s in block) * first.info.itemsize
        pending.append((nbytes, [read_block(r, block) for r in readers]))
        if len(pending) >= IN_FLIGHT:
            drain()
    while pending:
        drain()
    if first.info.size == 0:  # no block at all: still one row per step
        for acc in accs[1:]:
            acc.compared = True
    return accs
