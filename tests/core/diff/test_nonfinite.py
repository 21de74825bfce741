"""NaN and Inf in ``diff``: on the real diverged runs (``fixtures/diverged``: every parameter and
Adam moment NaN from step 5) and on small pairs. NaN equals NaN at the same places, never
silently (each side's counts, a note); a NaN against a number makes the largest difference NaN,
an Inf against another value Inf, and JSON carries either as null with ``_nonfinite`` beside."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.diff import DiffReport, LeafDiff, NonFiniteCounts
from ckpt_cli.core.diff.compare import Compare, nonfinite_counts
from ckpt_cli.core.diff.items import diff_paths
from tests.support.paths import REPO

DIVERGED = REPO / "fixtures" / "diverged"
TRUTH: dict[str, Any] = json.loads((DIVERGED / "truth.json").read_text())
#: The 12 leaves NaN from step 5 on (truth.json), by their names in item ``state``.
NAN_LEAVES = sorted(n.removeprefix("state/") for n in TRUTH["linen"]["nonfinite_at_first"])


def _strict(doc: object) -> Any:
    """``doc`` through a parser that refuses NaN and Infinity, as JavaScript's does."""

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(json.dumps(doc), parse_constant=refuse)


def _leaves(report: DiffReport) -> dict[str, LeafDiff]:
    return {d.name: d for d in report.all_leaves}


def _nan_count(step: int, name: str) -> int:
    return int(TRUTH["linen"]["steps"][str(step)]["items"]["state"][name]["nan"])


def test_finite_against_nan_is_different_and_says_where() -> None:
    """Step 4 (finite) against step 5 (NaN): each NaN leaf is different, its largest
    differences NaN (null in JSON, ``"nan"`` beside), its NaN counted on B's side."""
    report = diff_paths(f"{DIVERGED / 'linen'}@4", f"{DIVERGED / 'linen'}@5")
    leaves = _leaves(report)
    assert len(NAN_LEAVES) == 12
    for name in NAN_LEAVES:
        d = leaves[name]
        n = _nan_count(5, name)
        assert n == d.elements > 0 and _nan_count(4, name) == 0
        assert d.status == "different" and d.mismatched == n
        assert d.max_abs is not None and np.isnan(d.max_abs)
        assert d.max_rel is not None and np.isnan(d.max_rel)
        assert d.nonfinite == NonFiniteCounts(nan_b=n)
        assert d.message == f"{n} NaN in B"
        doc = _strict(d.to_json())
        assert doc["max_abs_diff"] is None and doc["max_abs_diff_nonfinite"] == "nan"
        assert doc["max_rel_diff"] is None and doc["max_rel_diff_nonfinite"] == "nan"
        assert doc["nonfinite"] == {
            "a": {"nan": 0, "inf": 0},
            "b": {"nan": n, "inf": 0},
            "both_nan": 0,
        }
    # The counters stay finite: measured as before.
    count = leaves["opt_state.0.count"]
    assert (count.max_abs, count.nonfinite) == (1.0, NonFiniteCounts())
    assert _strict(report.to_json())["schema_version"] == DiffReport.SCHEMA_VERSION == 5


def test_nan_at_the_same_places_is_equal_and_says_so() -> None:
    """Steps 6 and 7, both NaN everywhere in the same 12 leaves: equal (a faithful copy of a
    diverged step is equal to it), with nothing to measure and the NaN in the note."""
    report = diff_paths(f"{DIVERGED / 'linen'}@6", f"{DIVERGED / 'linen'}@7")
    leaves = _leaves(report)
    for name in NAN_LEAVES:
        d = leaves[name]
        n = _nan_count(6, name)
        assert n == _nan_count(7, name) == d.elements
        assert d.status == "equal" and d.mismatched == 0
        assert d.max_abs is None and d.max_rel is None  # not 0.0: no value was compared
        assert d.nonfinite == NonFiniteCounts(nan_a=n, nan_b=n, both_nan=n)
        assert d.has_nonfinite
        assert d.message == f"both NaN at the same {n} places"
        doc = _strict(d.to_json())
        assert doc["max_abs_diff"] is None and doc["max_abs_diff_nonfinite"] is None
    assert sorted(n for n, d in leaves.items() if d.has_nonfinite) == NAN_LEAVES
    assert {d.status for n, d in leaves.items() if n not in NAN_LEAVES} >= {"different"}


def test_a_nan_metric_is_counted_on_its_side() -> None:
    """The ``metrics`` item, ``{"loss": NaN}`` on disk from step 6: a JSON leaf, equal NaN
    against NaN, different against a number, the NaN counted either way."""
    root = DIVERGED / "linen"
    same = _leaves(diff_paths(f"{root}@6", f"{root}@7", item="metrics"))["loss"]
    assert same.status == "equal" and same.nonfinite == NonFiniteCounts(1, 0, 1, 0, 1)
    assert same.message == "both NaN at the same place"
    other = _leaves(diff_paths(f"{root}@5", f"{root}@7", item="metrics"))["loss"]
    assert other.status == "different" and other.nonfinite == NonFiniteCounts(nan_b=1)
    assert other.message is not None and other.message.endswith("vs NaN")


def test_values_not_read_have_no_counts() -> None:
    """``--structure`` reads no values: no counts, no figures (null in JSON)."""
    root = DIVERGED / "linen"
    report = diff_paths(f"{root}@4", f"{root}@5", structure_only=True)
    for d in report.all_leaves:
        assert d.nonfinite is None and d.max_abs is None
        assert _strict(d.to_json())["nonfinite"] is None


def _compare(a: Any, b: Any, atol: float = 0.0, rtol: float = 0.0) -> Compare:
    acc = Compare(atol, rtol, exact_ints=True)
    acc.add(np.asarray(a), np.asarray(b))
    return acc


def test_nan_at_the_same_places_and_a_finite_difference_elsewhere() -> None:
    acc = _compare([np.nan, 1.0, 2.0], [np.nan, 1.5, 2.0])
    assert (acc.mismatched, acc.max_abs, acc.max_rel) == (1, 0.5, 0.5 / 1.5)
    assert acc.counts() == NonFiniteCounts(nan_a=1, nan_b=1, both_nan=1)
    assert acc.counts().phrase() == "both NaN at the same place"


def test_nan_on_different_places_on_each_side() -> None:
    acc = _compare([np.nan, np.nan, 1.0], [np.nan, 0.0, np.nan])
    assert acc.mismatched == 2 and np.isnan(acc.max_abs or 0.0)
    assert acc.counts() == NonFiniteCounts(nan_a=2, nan_b=2, both_nan=1)
    assert acc.counts().phrase() == "2 NaN in A, 2 NaN in B, 1 of them at the same places"


def test_inf_against_a_finite_value_is_inf_and_never_within_a_tolerance() -> None:
    acc = _compare([1.0, np.inf, -np.inf], [1.0, 3.0, -np.inf], rtol=0.5)
    assert acc.mismatched == 1  # rtol * |inf| would have let it in
    assert acc.max_abs == acc.max_rel == np.inf
    assert acc.counts() == NonFiniteCounts(inf_a=2, inf_b=1)
    assert acc.counts().phrase() == "2 Inf in A, 1 Inf in B"
    assert _compare([1.0], [np.inf], rtol=0.5).mismatched == 1  # Inf on B's side too
    d = LeafDiff("w", "different", max_abs=acc.max_abs, max_rel=acc.max_rel)
    doc = _strict(d.to_json())
    assert doc["max_abs_diff"] is None and doc["max_abs_diff_nonfinite"] == "inf"


def test_the_same_inf_is_equal() -> None:
    acc = _compare([np.inf, -np.inf, 2.0], [np.inf, -np.inf, 2.0])
    assert (acc.mismatched, acc.max_abs, acc.max_rel) == (0, 0.0, 0.0)
    assert acc.counts() == NonFiniteCounts(inf_a=2, inf_b=2)


def test_nan_wins_over_inf() -> None:
    acc = _compare([1.0, 2.0], [np.inf, np.nan])
    assert np.isnan(acc.max_abs or 0.0) and np.isnan(acc.max_rel or 0.0)


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64]
)
def test_equal_blocks_are_counted_too(dtype: Any) -> None:
    """Blocks of equal bits skip the float64 pass: their NaN and Inf are counted all the same
    (2-byte floats by their exponent bits)."""
    a = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, np.nan], dtype=dtype)
    assert nonfinite_counts(a) == (2, 2)
    assert nonfinite_counts(a[[0, 4]]) == (0, 0)
    acc = _compare(a, a.copy())
    assert acc.mismatched == 0 and acc.max_abs == 0.0
    assert acc.counts() == NonFiniteCounts(2, 2, 2, 2, 2)
    assert nonfinite_counts(np.arange(4)) == (0, 0)


def test_the_phrase_is_none_when_both_sides_are_finite() -> None:
    assert NonFiniteCounts().phrase() is None
    assert not NonFiniteCounts().any
