"""``core.diff.compare.Compare``: blocks compared in tiles (a transposed view against a C-order
block, values that differ) give the figures of one float64 pass over the whole pair."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.diff import compare as values
from ckpt_cli.core.diff.compare import Compare, layout_tiles, value_parts


def reference(a: Any, b: Any, atol: float, rtol: float) -> tuple[int, str, str]:
    """Mismatched count, max abs and max rel difference by numpy, the whole pair at once: a
    NaN difference (NaN against a number) makes both NaN, else an Inf one makes both Inf."""
    af, bf = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    same = (af == bf) | (np.isnan(af) & np.isnan(bf))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(same, 0.0, np.abs(af - bf))
        ok = same | (np.isfinite(diff) & (diff <= atol + rtol * np.abs(bf)))
        bad = ~np.isfinite(diff)
        worst = math.nan if np.isnan(diff).any() else math.inf if bad.any() else None
        max_abs = worst if worst is not None else float(diff.max(initial=0.0))
        rel = ~bad & ~same & (bf != 0)
        max_rel = float((diff[rel] / np.abs(bf[rel])).max()) if rel.any() else 0.0
        max_rel = worst if worst is not None else max_rel
    return int(np.count_nonzero(~ok)), repr(max_abs), repr(max_rel)


def figures(acc: Compare) -> tuple[int, str, str]:
    """As ``reference`` gives them (``repr``: NaN compares equal to NaN)."""
    return acc.mismatched, repr(acc.max_abs), repr(acc.max_rel)


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of a few elements, so a small pair is cut in many."""
    monkeypatch.setattr(values, "LAYOUT_TILE_RUN", 4)
    monkeypatch.setattr(values, "LAYOUT_TILE_ELEMENTS", 24)
    monkeypatch.setattr(values, "VALUE_PART_ELEMENTS", 10)


@pytest.mark.usefixtures("small_tiles")
@pytest.mark.parametrize("axes", [(1, 0), (2, 0, 1), (0, 2, 1), (1, 2, 0)])
def test_a_transposed_view_against_its_copy_in_tiles(axes: tuple[int, ...]) -> None:
    rng = np.random.default_rng(5)
    shape = (13, 7, 11)[: len(axes)]
    src = rng.standard_normal(shape).astype(np.float32)
    a = np.transpose(src, axes)  # a view: its contiguous axis is not the last one
    b = np.ascontiguousarray(a)
    assert len(layout_tiles(a, b)) > 1
    acc = Compare(0.0, 0.0, True)
    acc.add(a, b)
    assert figures(acc) == (0, "0.0", "0.0")
    b = b.copy()
    flat = b.reshape(-1)
    flat[[0, 17, flat.size // 2, flat.size - 1]] += np.float32(0.5)
    flat[5] = np.nan
    flat[9] = np.inf
    for atol, rtol in [(0.0, 0.0), (0.6, 0.0), (0.0, 1e-3)]:
        acc = Compare(atol, rtol, True)
        acc.add(a, b)
        assert figures(acc) == reference(a, b, atol, rtol)
        assert acc.mismatched > 0


@pytest.mark.usefixtures("small_tiles")
def test_tiles_of_casts_ints_and_nan_at_the_same_place() -> None:
    rng = np.random.default_rng(6)
    src = rng.standard_normal((9, 14)).astype(np.float32)
    src[2, 3] = np.nan
    a = src.T
    b = np.ascontiguousarray(a).astype(ml_dtypes.bfloat16)  # a cast export, compared as float64
    acc = Compare(0.0, 0.0, False)
    acc.add(a, b)
    assert figures(acc) == reference(a, b, 0.0, 0.0) and acc.mismatched > 0
    ints = rng.integers(-(2**62), 2**62, size=(8, 10), dtype=np.int64)
    other = np.ascontiguousarray(ints.T)
    other[3, 1] += 1  # beyond float64's precision: only an integer comparison sees it
    acc = Compare(0.0, 0.0, True)
    acc.add(ints.T, other)
    assert acc.mismatched == 1
    scalar = Compare(0.0, 0.0, True)
    scalar.add(np.float32(2.0), np.float32(2.5))
    assert figures(scalar) == (1, "0.5", "0.2")


def test_value_parts_cover_a_block_once() -> None:
    for shape in [(7,), (300, 1000), (3, 5, 100_000), (2, 300_000)]:
        parts = value_parts(shape)
        assert parts
        seen = np.zeros(shape, np.int8) if math.prod(shape) < 10**7 else None
        for p in parts:
            assert math.prod(s.stop - s.start for s in p) <= max(
                values.VALUE_PART_ELEMENTS, shape[-1]
            )
            if seen is not None:
                seen[p] += 1
        if seen is not None:
            assert (seen == 1).all()
