"""``trend`` in units (``core/trend/distributed.py``) on real Orbax saves: a leaf larger than a
unit is cut into runs of the blocks one process reads it in, every unit's accumulators merge
exactly, and the figures are the same bits as one process's, whatever the unit size or the
order units end in."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.executor import Executor, ExecutorSpec, InlineExecutor
from ckpt_cli.core.trend import distributed, read
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.plan import plan_trend
from ckpt_cli.core.trend.run import trend
from ckpt_cli.core.trend.types import TrendReport
from tests.support.trend_runs import WIDE_LEAF, WIDE_NAN_STEP, WIDE_SHAPE, WIDE_STEPS, TrendRuns


class Shuffled(Executor):
    """Units run here, their results arriving in a shuffled order (as workers end them)."""

    name = "shuffled"
    workers = 3

    def __init__(self) -> None:
        self.units: list[Any] = []

    def map(self, fn: Any, units: Any, on_done: Any = None) -> list[Any]:
        self.units = list(units)
        order = list(range(len(self.units)))
        random.Random(7).shuffle(order)
        results: dict[int, Any] = {}
        for i in order:
            results[i] = fn(self.units[i])
            if on_done is not None:
                on_done(results[i])
        return [results[i] for i in range(len(self.units))]


def figures(report: TrendReport) -> list[Any]:
    return [lf.to_json() for lf in report.leaves]


def test_exact_sums_do_not_depend_on_the_merge_order() -> None:
    """Blocks whose sums span 30 orders of magnitude and cancel: every merge order gives the
    same bits, the correctly rounded sum of the blocks' sums (a float64 running sum does not)."""
    rng = np.random.default_rng(3)
    blocks = [rng.standard_normal(64) * 10.0 ** rng.integers(-15, 15) for _ in range(40)]
    blocks += [-b for b in blocks[:10]]
    accs = []
    for b in blocks:
        acc = Acc()
        acc.add(b, b * 0.5)
        accs.append(acc)
    totals = set()
    for seed in range(6):
        order = list(accs)
        random.Random(seed).shuffle(order)
        merged = Acc()
        for a in order:
            merged = merged.merge(a)
        totals.add((merged.total, merged.squares, merged.update, merged.size, merged.max_abs))
    assert len(totals) == 1
    ((total, squares, update, size, _),) = totals
    assert total == math.fsum(a.total for a in accs) and size == 64 * 50
    assert squares == math.fsum(a.squares for a in accs)
    assert update == math.fsum(a.update for a in accs)
    naive = {sum(a.total for a in random.Random(s).sample(accs, len(accs))) for s in range(6)}
    assert len(naive) > 1  # what the exact sums are for


def test_overflow_and_nonfinite_sums_are_what_float64_gives() -> None:
    up, down = Acc(), Acc()
    up.add(np.array([1e308]))
    down.add(np.array([-1e308]))
    assert up.total == 1e308 and up.merge(up).total == math.inf
    assert up.merge(up).merge(up).total == math.inf
    assert down.merge(down).total == -math.inf
    assert math.isnan(up.merge(up).merge(down.merge(down)).total)  # Inf - Inf


def test_a_large_leaf_is_cut_into_runs_of_its_blocks_and_gives_the_same_bits(
    wide_run: Path,
) -> None:
    plan = plan_trend(wide_run)
    here = trend(plan)
    segs = read.segments(plan)
    same = [read.unchanged(plan, name, seg) for name, seg in segs]
    units = list(distributed.plan_units(plan, segs, same, 1 << 20))
    wide = [p for u in units for p in u.parts if p.name == WIDE_LEAF]
    assert len(wide) >= 4 and all(p.blocks for p in wide)
    cut = [b for p in wide for b in p.blocks or ()]
    assert cut == list(read.blocks(plan.leaves[0].at[0][1], True, read.step_block(plan)))
    assert sum(p.nbytes for p in wide) == math.prod(WIDE_SHAPE) * 4 * len(WIDE_STEPS)

    shuffled = Shuffled()
    scaled = trend(plan, None, shuffled, 1 << 20)
    assert len(shuffled.units) == len(units)
    assert figures(scaled) == figures(here)  # the same bits
    assert scaled.findings == here.findings
    assert scaled.scale is not None and scaled.scale.units == len(units)
    row = scaled.leaf(WIDE_LEAF).steps
    assert [s.nonfinite for s in row] == [int(s == WIDE_NAN_STEP) for s in WIDE_STEPS]
    assert here.scale is None


@pytest.mark.parametrize("unit_bytes", [1, 4 << 10, 1 << 30])
def test_any_unit_size_gives_the_single_process_bits(
    trend_runs: TrendRuns, unit_bytes: int
) -> None:
    plan = plan_trend(trend_runs.diverged)
    here = trend(plan)
    progress: list[Any] = []
    scaled = trend(plan, progress.append, InlineExecutor(), unit_bytes)
    assert figures(scaled) == figures(here) and scaled.findings == here.findings
    assert scaled.scale is not None and scaled.scale.split
    assert scaled.scale.units >= (2 if unit_bytes < 1 << 30 else 1)
    assert progress and progress[-1].done == progress[-1].total == plan.nbytes


def test_a_split_that_does_not_pay_reads_here_and_says_why(trend_runs: TrendRuns) -> None:
    plan = plan_trend(trend_runs.healthy)
    report = trend(plan, None, ExecutorSpec("local", 2))
    assert report.scale is not None and not report.scale.split and report.scale.units == 0
    assert report.scale.reason and "--force-split" in report.scale.reason
    assert figures(report) == figures(trend(plan))
