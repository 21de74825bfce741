"""``trend`` on real training runs (``tests/support/trend_runs.py``): every figure is numpy's on
the values Orbax restores, the findings name exactly the frozen, zero and NaN leaves and steps,
figures merge across blocks, and the selection of steps."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import ckpt_cli
from ckpt_cli.core.digest.records import DIGEST_FILE
from ckpt_cli.core.trend import read as trend_read
from ckpt_cli.core.trend.accum import Acc
from ckpt_cli.core.trend.plan import plan_trend
from ckpt_cli.core.trend.run import trend
from ckpt_cli.core.trend.types import TrendOptions, TrendReport
from ckpt_cli.errors import NotFoundError, UsageError
from tests.support.trend_runs import (
    DEAD_LEAF,
    DEAD_STEP,
    DEAD_UNIT,
    FROZEN,
    NAN_LEAF,
    NAN_STEP,
    STEPS,
    TrendRuns,
)

ZERO_LEAVES = {
    "params.gate",
    "params.Dense_1.bias",  # frozen, and zero from its initializer on
    "opt_state.inner_states.train.inner_state.0.mu.gate",
    "opt_state.inner_states.train.inner_state.0.nu.gate",
}


def restored(root: Path, step: int) -> dict[str, np.ndarray]:
    """The step as Orbax restores it, flattened to ckpt's dotted leaf names."""
    import jax
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore((root / str(step) / "default").absolute())
    flat = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(
            str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path
        )
        flat[name] = np.asarray(value)
    assert flat
    return flat


def expected(values: dict[int, dict[str, np.ndarray]]) -> dict[str, list[dict[str, Any]]]:
    """Each leaf's rows as numpy computes them, in float64; a leaf holding any NaN/Inf has no
    norm, rms, max_abs or mean (None), and no update against or from it."""
    out: dict[str, list[dict[str, Any]]] = {}
    prev: dict[str, np.ndarray] = {}
    for step in sorted(values):
        for name, raw in values[step].items():
            x = raw.astype(np.float64)
            bad = not np.isfinite(x).all()
            row: dict[str, Any] = {
                "step": step,
                "norm": None if bad else float(np.sqrt(np.sum(x**2))),
                "rms": None if bad or not x.size else float(np.sqrt(np.mean(x**2))),
                "max_abs": None if bad else (float(np.max(np.abs(x))) if x.size else 0.0),
                "mean": None if bad or not x.size else float(np.mean(x)),
                "zeros": float(np.mean(x == 0)),
                "nonfinite": int(np.sum(~np.isfinite(x))),
                "update_norm": None,
                "update_ratio": None,
                "dead_units": None,
                "new_dead_units": None,
            }
            if x.ndim >= 2:  # units: the last axis; dead: every value 0 (NaN is not 0)
                dead = np.all(raw.reshape(-1, raw.shape[-1]) == 0, axis=0)
                row["dead_units"] = int(dead.sum())
            if name in prev and not bad and np.isfinite(prev[name]).all():
                d = x - prev[name]
                row["update_norm"] = float(np.sqrt(np.sum(d**2)))
                before = out[name][-1]["norm"]
                row["update_ratio"] = row["update_norm"] / before if before else None
            if name in prev and x.ndim >= 2:
                was = np.all(prev[name].reshape(-1, x.shape[-1]) == 0, axis=0)
                row["new_dead_units"] = int((dead & ~was).sum())
            out.setdefault(name, []).append(row)
            prev[name] = x
    return out


def assert_rows_equal(report: TrendReport, want: dict[str, list[dict[str, Any]]]) -> None:
    got = {lf.name: [s.to_json() for s in lf.steps] for lf in report.leaves}
    assert want and set(got) == set(want)
    for name, rows in want.items():
        assert len(got[name]) == len(rows) == STEPS, name
        for g, w in zip(got[name], rows, strict=True):
            assert set(g) == set(w)
            for key, value in w.items():
                if value is None:
                    assert g[key] is None, (name, g["step"], key)
                else:
                    assert g[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, key, g)


@pytest.fixture(scope="module")
def reports(trend_runs: TrendRuns) -> dict[str, TrendReport]:
    return {
        "healthy": trend(plan_trend(trend_runs.healthy)),
        "diverged": trend(plan_trend(trend_runs.diverged)),
    }


@pytest.mark.parametrize("run", ["healthy", "diverged"])
def test_every_figure_is_numpys_on_the_values_orbax_restores(
    trend_runs: TrendRuns, reports: dict[str, TrendReport], run: str
) -> None:
    root = getattr(trend_runs, run)
    values = {step: restored(root, step) for step in range(1, STEPS + 1)}
    report = reports[run]
    assert report.steps == tuple(range(1, STEPS + 1))
    assert_rows_equal(report, expected(values))


def test_the_healthy_run_finds_the_frozen_layer_and_the_zero_leaves(
    reports: dict[str, TrendReport],
) -> None:
    report = reports["healthy"]
    found = {(f.kind, f.leaf, f.step, f.severity) for f in report.findings}
    frozen = {("frozen", leaf, 1, "warning") for leaf in FROZEN if leaf not in ZERO_LEAVES}
    zero = {("zero", leaf, 1, "warning") for leaf in ZERO_LEAVES}
    dead = {("dead", DEAD_LEAF, DEAD_STEP, "warning")}
    assert found == frozen | zero | dead
    assert report.ok


def test_the_unit_the_mask_killed_is_dead_from_its_step_on(
    trend_runs: TrendRuns, reports: dict[str, TrendReport]
) -> None:
    """Unit DEAD_UNIT's column of the kernel is all zero from DEAD_STEP on, and at no step
    before: one ``dead`` finding, at that step; the counts per step say so too."""
    values = {step: restored(trend_runs.healthy, step)[DEAD_LEAF] for step in range(1, STEPS + 1)}
    zero_at = [s for s, v in values.items() if not v[:, DEAD_UNIT].any()]
    assert zero_at == list(range(DEAD_STEP, STEPS + 1))
    rows = reports["healthy"].leaf(DEAD_LEAF).steps
    assert [r.dead_units for r in rows] == [0] * (DEAD_STEP - 1) + [1] * (STEPS - DEAD_STEP + 1)
    assert [r.new_dead_units for r in rows] == [None] + [int(r.step == DEAD_STEP) for r in rows[1:]]
    (dead,) = [f for f in reports["healthy"].findings if f.kind == "dead"]
    assert (dead.leaf, dead.step) == (DEAD_LEAF, DEAD_STEP)
    assert dead.message == (
        f"1 of 16 units (last axis) all zero at step {DEAD_STEP} that were not at step "
        f"{DEAD_STEP - 1} (1 all zero now)"
    )
    # One-dimensional leaves have no units; a step range that starts after the death has none.
    assert reports["healthy"].leaf("params.Dense_0.bias").steps[-1].dead_units is None
    later = trend(plan_trend(trend_runs.healthy, TrendOptions(steps=f"{DEAD_STEP}-")))
    assert not [f for f in later.findings if f.kind == "dead"]
    assert later.leaf(DEAD_LEAF).steps[0].dead_units == 1
    # --dead-units 2: one unit is not enough.
    strict = trend(plan_trend(trend_runs.healthy, TrendOptions(dead_units=2, match="params.*")))
    assert not [f for f in strict.findings if f.kind == "dead"]


def test_the_diverged_run_names_each_leaf_at_its_first_nonfinite_step(
    trend_runs: TrendRuns, reports: dict[str, TrendReport]
) -> None:
    values = {step: restored(trend_runs.diverged, step) for step in range(1, STEPS + 1)}
    first: dict[str, int] = {}
    for step in sorted(values):
        for name, x in values[step].items():
            if x.dtype.kind == "f" and not np.isfinite(x).all():
                first.setdefault(name, step)
    assert first[NAN_LEAF] == NAN_STEP and len(first) > 1
    report = reports["diverged"]
    errors = [f for f in report.findings if f.severity == "error"]
    assert {(f.leaf, f.step) for f in errors} == set(first.items())
    assert all(f.kind == "nonfinite" for f in errors)
    # Errors first, the earliest first: the NaN put in at NAN_STEP, then what it spread to.
    assert report.findings[0].leaf == NAN_LEAF and report.findings[0].step == NAN_STEP
    assert report.findings[: len(errors)] == tuple(errors)
    # A leaf turned NaN changed: it is not frozen, nor zero any more.
    warned = {(f.kind, f.leaf) for f in report.findings if f.severity == "warning"}
    assert warned == {
        ("frozen", "params.Dense_1.kernel"),
        ("zero", "params.Dense_1.bias"),
        ("dead", DEAD_LEAF),
    }
    assert not report.ok and report.to_json()["ok"] is False


def test_the_metrics_are_the_losses_saved_with_each_step(
    trend_runs: TrendRuns, reports: dict[str, TrendReport]
) -> None:
    metrics = dict(reports["healthy"].metrics)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert {s: m["loss"] for s, m in metrics.items()} == pytest.approx(trend_runs.losses)
    # The diverged run's loss is NaN after the NaN: null in the document (JSON has no NaN).
    doc = reports["diverged"].to_json()["metrics"]
    assert doc[-1]["metrics"]["loss"] is None and doc[0]["metrics"]["loss"] is not None


def test_figures_merge_across_blocks(
    trend_runs: TrendRuns, reports: dict[str, TrendReport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of 64 bytes (a leaf of 128 values is read in 8 pieces per step): the same figures
    as whole-leaf reads. (Read through TensorStore: streaming is the next test's.)"""
    monkeypatch.setattr(trend_read, "MIN_STEP_BLOCK", 64)
    monkeypatch.setattr(trend_read, "streamed_slabs", lambda *a, **k: None)
    reads = []
    real = trend_read.read_block

    def counted(reader: Any, block: Any) -> Any:
        reads.append(block)
        return real(reader, block)

    monkeypatch.setattr(trend_read, "read_block", counted)
    small = trend(plan_trend(trend_runs.diverged, TrendOptions(block_bytes=64)))
    big = reports["diverged"]
    # Dense_0.kernel (8 x 16 float32, 512 bytes): 8 blocks at each of the 6 steps.
    assert len(reads) >= 8 * STEPS
    assert all(math.prod(s.stop - s.start for s in b) * 4 <= 64 for b in reads)
    assert [lf.name for lf in small.leaves] == [lf.name for lf in big.leaves]
    for a, b in zip(small.leaves, big.leaves, strict=True):
        for sa, sb in zip(a.steps, b.steps, strict=True):
            for key, value in sb.to_json().items():
                if value is None:
                    assert sa.to_json()[key] is None
                else:
                    assert sa.to_json()[key] == pytest.approx(value, rel=1e-12), (a.name, key)
    assert small.findings == big.findings


def assert_same_figures(got: TrendReport, want: TrendReport) -> None:
    assert [lf.name for lf in got.leaves] == [lf.name for lf in want.leaves]
    for a, b in zip(got.leaves, want.leaves, strict=True):
        assert [s.step for s in a.steps] == [s.step for s in b.steps]
        for sa, sb in zip(a.steps, b.steps, strict=True):
            for key, value in sb.to_json().items():
                if value is None:
                    assert sa.to_json()[key] is None, (a.name, key)
                else:
                    assert sa.to_json()[key] == pytest.approx(value, rel=1e-12), (a.name, key)
    assert got.findings == want.findings


def test_chunks_over_the_block_budget_stream_slab_by_slab(
    cli: Any,
    trend_runs: TrendRuns,
    reports: dict[str, TrendReport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk larger than the block budget is streamed as ``verify --deep`` streams it (range
    reads, zstd decoded as a stream), every step of the leaf in step, never decoded whole
    through TensorStore: the same figures, and with recorded digests the same skipped reads."""
    monkeypatch.setattr(trend_read, "MIN_STEP_BLOCK", 64)
    slabs: dict[str, list[int]] = {}
    real_streamed = trend_read.streamed_slabs

    def streamed(info: Any, reader: Any, budget: int) -> Any:
        got = real_streamed(info, reader, budget)
        assert got is not None, info
        for _, values in got:
            slabs.setdefault(str(info.shape), []).append(values.nbytes)
            yield _, values

    blocks: list[Any] = []
    real_block = trend_read._block
    monkeypatch.setattr(trend_read, "streamed_slabs", streamed)
    monkeypatch.setattr(trend_read, "_block", lambda *a: blocks.append(a[3]) or real_block(*a))
    small = trend(plan_trend(trend_runs.diverged, TrendOptions(block_bytes=64)))
    assert_same_figures(small, reports["diverged"])
    # Dense_0.kernel (8 x 16 float32, one 512-byte chunk): 8 slabs of 64 bytes at each step.
    assert slabs["(8, 16)"] and max(slabs["(8, 16)"]) <= 64
    assert len(slabs["(8, 16)"]) >= 8 * STEPS
    assert all(math.prod(s.stop - s.start for s in b) * 4 <= 64 for b in blocks)

    root = tmp_path / "healthy"
    shutil.copytree(trend_runs.healthy, root)
    assert cli("verify", root, "--record").code == 0
    slabs.clear()
    everything = trend(plan_trend(root, TrendOptions(block_bytes=64, read_all=True)))
    read_all = sum(len(v) for v in slabs.values())
    slabs.clear()
    skipping = trend(plan_trend(root, TrendOptions(block_bytes=64)))
    assert skipping.skipped_reads == 25 and everything.skipped_reads == 0
    assert 0 < sum(len(v) for v in slabs.values()) < read_all
    assert_same_figures(skipping, everything)
    assert_same_figures(everything, reports["healthy"])


def test_a_streamed_leaf_is_every_slab_at_every_step_and_stops_at_the_next_slab() -> None:
    """``_stream`` folds slab k of every step with slab k of the step before; once the run is
    abandoned (Ctrl-C sets ``stop``), it reads no further slab of any step."""
    values = np.random.default_rng(5).standard_normal((3, 40, 6)).astype(np.float32)
    read: list[tuple[int, int]] = []

    def slabs(step: int) -> Any:
        for row in range(0, 40, 4):
            read.append((step, row))
            yield (row, 0), values[step, row : row + 4]

    info: Any = SimpleNamespace(shape=(40, 6), nbytes=40 * 6 * 4)  # what _stream reads of it
    streaming = trend_read.Streaming(1)
    whole = trend_read._stream("x", info, [slabs(0), None, slabs(2)], lambda n: None, streaming)
    assert len(read) == 2 * 10
    assert [a.size for a in whole] == [240, 240, 240]
    assert whole[0].norm == pytest.approx(float(np.linalg.norm(values[0].astype(np.float64))))
    assert whole[1].norm == whole[0].norm and whole[1].update == 0.0  # step 1: as step 0
    moved = values[2].astype(np.float64) - values[0]
    assert whole[2].update == pytest.approx(float(np.sum(moved**2)), rel=1e-12)

    read.clear()
    trend_read._stream("x", info, [slabs(0), slabs(1)], lambda n: streaming.stop.set(), streaming)
    assert sorted(read) == [(0, 0), (1, 0)]


def test_merged_accumulators_are_one_over_the_whole() -> None:
    rng = np.random.default_rng(0)
    x, prev = rng.standard_normal(1000), rng.standard_normal(1000)
    x[[3, 500]] = [np.nan, np.inf]
    x[10:20] = 0
    whole, a, b = Acc(), Acc(), Acc()
    whole.add(x, prev)
    a.add(x[:400], prev[:400])
    b.add(x[400:], prev[400:])
    m = a.merge(b)
    assert (m.size, m.finite, m.zeros, m.nonfinite) == (1000, 998, 10, 2)
    assert m.norm == pytest.approx(whole.norm, rel=1e-12)
    assert m.update_norm == pytest.approx(whole.update_norm, rel=1e-12)
    assert m.max_abs == whole.max_abs and m.mean == pytest.approx(whole.mean, rel=1e-12)
    assert m.zero_fraction == 0.01


def test_steps_selects_a_range_and_updates_start_there(trend_runs: TrendRuns) -> None:
    report = trend(plan_trend(trend_runs.healthy, TrendOptions(steps="3-5", match="params.*")))
    assert report.steps == (3, 4, 5)
    assert report.leaves and all(lf.name.startswith("params.") for lf in report.leaves)
    for lf in report.leaves:
        assert [s.step for s in lf.steps] == [3, 4, 5]
        assert lf.steps[0].update_norm is None and lf.steps[1].update_norm is not None


def test_a_step_directory_is_one_step_with_its_metrics(trend_runs: TrendRuns) -> None:
    report = trend(plan_trend(trend_runs.healthy / "2"))
    assert report.steps == (2,)
    assert dict(report.metrics)[2]["loss"] == pytest.approx(trend_runs.losses[2])
    assert all(s.update_norm is None for lf in report.leaves for s in lf.steps)


def test_bad_selections_are_refused(trend_runs: TrendRuns) -> None:
    with pytest.raises(UsageError, match="not a list of steps"):
        plan_trend(trend_runs.healthy, TrendOptions(steps="x"))
    with pytest.raises(NotFoundError, match="step 9 is not a committed step"):
        plan_trend(trend_runs.healthy, TrendOptions(steps="9"))
    with pytest.raises(NotFoundError, match="no committed step matches"):
        plan_trend(trend_runs.healthy, TrendOptions(steps="100-"))
    with pytest.raises(NotFoundError, match="no leaf"):
        plan_trend(trend_runs.healthy, TrendOptions(match="nothing.*here"))


def test_the_public_api_plans_and_runs(trend_runs: TrendRuns) -> None:
    plan = ckpt_cli.plan_trend(str(trend_runs.healthy), ckpt_cli.TrendOptions(steps="5-"))
    assert isinstance(plan, ckpt_cli.TrendPlan)
    report = ckpt_cli.trend(plan)
    assert isinstance(report, ckpt_cli.TrendReport) and report.steps == (5, 6)
    assert not math.isnan(report.leaf(NAN_LEAF).steps[-1].norm)


def test_units_merge_across_row_and_column_blocks() -> None:
    """A unit (column) is all zero only when every block holding part of it says so."""
    x = np.arange(1.0, 25.0).reshape(4, 6)
    x[:, 1] = 0  # dead
    x[:3, 4] = 0  # zero in the first block of rows only: alive
    x[:, 5] = [0, 0, 0, np.nan]  # NaN is not zero: alive
    whole = Acc()
    whole.add(x, units=(6, slice(0, 6)))
    parts = []
    for rows in (slice(0, 3), slice(3, 4)):
        for cols in (slice(0, 4), slice(4, 6)):
            acc = Acc()
            acc.add(x[rows, cols], units=(6, cols))
            parts.append(acc)
    merged = parts[0]
    for p in parts[1:]:
        merged = merged.merge(p)
    assert whole.alive.tolist() == [True, False, True, True, True, True]
    assert merged.alive.tolist() == whole.alive.tolist()


def test_recorded_digests_skip_the_reads_of_unchanged_leaves(  # type: ignore[no-untyped-def]
    cli, trend_runs: TrendRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``verify --record``, a leaf whose ld1 digest at a step equals the step before's is
    not read there: the frozen and zero leaves are read at their first step only, and every
    figure and finding is the one a full read gives."""
    root = tmp_path / "healthy"
    shutil.copytree(trend_runs.healthy, root)
    assert cli("verify", root, "--record").code == 0
    records = {
        step: json.loads((root / str(step) / "default" / DIGEST_FILE).read_text())["leaves"]
        for step in range(1, STEPS + 1)
    }
    unchanged = [
        (name, step)
        for step in range(2, STEPS + 1)
        for name, d in records[step].items()
        if d["ld1"] == records[step - 1][name]["ld1"]
    ]
    assert {name for name, _ in unchanged} == set(FROZEN) | ZERO_LEAVES
    assert len(unchanged) == 5 * (STEPS - 1)

    reads: list[Any] = []
    real = trend_read.read_block

    def counted(reader: Any, block: Any) -> Any:
        reads.append(block)
        return real(reader, block)

    monkeypatch.setattr(trend_read, "read_block", counted)
    everything = trend(plan_trend(root, TrendOptions(read_all=True)))
    all_reads = len(reads)
    assert all_reads == 13 * STEPS and everything.skipped_reads == 0  # a block per leaf and step
    reads.clear()
    skipping = trend(plan_trend(root))
    assert len(reads) == all_reads - len(unchanged)
    assert skipping.skipped_reads == len(unchanged)
    assert [[s.to_json() for s in lf.steps] for lf in skipping.leaves] == [
        [s.to_json() for s in lf.steps] for lf in everything.leaves
    ]
    assert skipping.findings == everything.findings
    assert skipping.to_json()["skipped_reads"] == 25

    # A damaged record is no record: that step's leaves are read (and its successor's).
    (root / "3" / "default" / DIGEST_FILE).write_text("{not json")
    reads.clear()
    damaged = trend(plan_trend(root))
    assert damaged.skipped_reads == len(unchanged) - 2 * 5
    assert len(reads) == all_reads - damaged.skipped_reads
