"""Run ``trend``: every leaf of the plan, block by block, all its steps read together
(``read.py``), here on ``threads()`` threads, or in units on an executor's workers
(``distributed.py``, when asked and the split pays); then the rows, the metrics and findings.

Tasks of all leaves run on ``threads()`` threads, at most ``threads() + IN_FLIGHT`` at once, and
their accumulators merge exactly (``accum.Acc``), so one large leaf uses every core, and the
figures are the same bits whichever way the blocks were spread. Each selected step is read once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

from ckpt_cli.core.executor import Executor, ExecutorSpec
from ckpt_cli.core.format.arrays import ItemStore, cached_context
from ckpt_cli.core.format.blocks import cache_bytes
from ckpt_cli.core.format.tiers import partial_leaf_refusal
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.scale import DEFAULT_UNIT_BYTES
from ckpt_cli.core.threads import threads
from ckpt_cli.core.trend import read
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.distributed import read_scaled
from ckpt_cli.core.trend.findings import findings
from ckpt_cli.core.trend.types import LeafTrend, StepStats, TrendPlan, TrendReport

Segments = list[tuple[str, read.Segment]]
#: Per step of a segment: (units all 0, of them not all 0 at the step before), or None.
Dead = list[tuple[int, int] | None]


def trend(
    plan: TrendPlan,
    on_progress: ProgressFn | None = None,
    executor: Executor | ExecutorSpec | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> TrendReport:
    """Read every leaf of ``plan`` at every step (progress as ``trend`` bytes) and return the
    figures, the run's metrics and the findings. ``executor``: read in units of about
    ``unit_bytes`` on its workers (``distributed``); a spec that does not scale out, or whose
    split does not pay (``should_split``), reads here (the report's ``scale`` says which)."""
    segs = read.segments(plan)
    same = [read.unchanged(plan, name, seg) for name, seg in segs]
    done = ByteProgress(on_progress, "trend", plan.nbytes)
    if isinstance(executor, ExecutorSpec) and not executor.scaled:
        executor = None
    scale = None
    accs: list[list[Acc]] | None = None
    try:
        if executor is not None:
            accs, scale = read_scaled(plan, segs, same, executor, unit_bytes, done)
        if accs is None:
            accs, dead = _read_here(plan, segs, same, done)
        else:
            dead = [_dead_units(a) for a in accs]
    except read.LeafUnreadable as e:
        _refuse_local_tier(plan, e.leaf)
        raise
    metrics = tuple((r.step, r.metrics) for r in plan.steps if r.metrics)
    report = TrendReport(
        plan.root,
        plan.item,
        tuple(r.step for r in plan.steps),
        _rows(plan, segs, accs, dead),
        metrics,
        (),
        plan.options,
        sum(sum(s) for s in same),
        scale,
    )
    return replace(report, findings=findings(report))


def _refuse_local_tier(plan: TrendPlan, leaf: str) -> None:
    """A leaf only partly stored at a step that is one host's local tier of Orbax's emergency
    checkpointing: refused as such (not damage); otherwise the read error stands."""
    for step in plan.steps:
        if (refusal := partial_leaf_refusal(step.ref.location, leaf)) is not None:
            raise refusal from None


def _read_here(
    plan: TrendPlan, segs: Segments, same: list[list[bool]], done: ByteProgress
) -> tuple[list[list[Acc]], list[Dead]]:
    """Every segment's accumulators, read on this process's threads, and its dead units
    (``_dead_units``: counted as soon as a segment's every block is merged)."""
    budget = plan.options.block_bytes
    per_step = read.step_block(plan)
    infos = [info for leaf in plan.leaves for _, info, _ in leaf.at]
    # A chunk larger than a step's block is decoded once into the cache, for all its slabs.
    cache = cache_bytes(infos, per_step) * len(plan.steps)
    context = cached_context(cache) if cache else None
    stores = {r.step: ItemStore(r.ref.location, r.zarr3, context) for r in plan.steps}
    accs = [[Acc() for _ in seg] for _, seg in segs]
    dead: list[Dead] = [[] for _ in segs]
    workers = max(1, threads())
    streaming = read.Streaming(max(1, workers // max(1, len(plan.steps))))

    def jobs(i: int) -> Iterator[read.Job]:
        name, seg = segs[i]
        readers = [stores[step].reader(name, info, db) for step, info, db in seg]
        return read.leaf_jobs(name, readers, same[i], per_step, budget, done, streaming)

    def finished(i: int) -> None:  # every block merged: the units counted, their flags freed
        dead[i] = _dead_units(accs[i])

    with streaming.ending():
        read.fold(((i, jobs(i)) for i in range(len(segs))), accs, workers, finished)
    return accs, dead


def _dead_units(accs: list[Acc]) -> Dead:
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
    plan: TrendPlan, segs: Segments, accs: list[list[Acc]], dead: list[Dead]
) -> tuple[LeafTrend, ...]:
    rows: dict[str, list[StepStats]] = {leaf.name: [] for leaf in plan.leaves}
    for (name, seg), seg_accs, seg_dead in zip(segs, accs, dead, strict=True):
        prev_norm: float | None = None
        prev_bad = False
        for i, ((step, _, _), acc) in enumerate(zip(seg, seg_accs, strict=True)):
            units = seg_dead[i]
            # A statistic of values holding NaN/Inf is not a number (null, the count beside
            # it), never the figure of the finite part: an all-NaN leaf has no norm of 0.
            bad = acc.nonfinite > 0
            upd = acc.update if i and not bad and not prev_bad else None
            upd_norm = math.sqrt(upd) if upd is not None else None
            ratio = upd_norm / prev_norm if upd_norm is not None and prev_norm else None
            rows[name].append(
                StepStats(
                    step,
                    None if bad else acc.norm,
                    None if bad else acc.rms,
                    None if bad else acc.max_abs,
                    None if bad else acc.mean,
                    acc.zero_fraction,
                    acc.nonfinite,
                    upd_norm,
                    ratio,
                    None if units is None else units[0],
                    None if units is None or not i else units[1],
                )
            )
            prev_norm, prev_bad = (None if bad else acc.norm), bad
    return tuple(
        LeafTrend(leaf.name, leaf.part, leaf.dtype, leaf.shape, tuple(rows[leaf.name]))
        for leaf in plan.leaves
    )
