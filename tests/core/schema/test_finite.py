"""``core.schema.finite``: a NaN or Inf float becomes null, and where it was says which."""

from __future__ import annotations

import json
import math

from ckpt_cli.core.schema.finite import finite_or_none, nonfinite_kind, split_nonfinite


def test_the_kind_of_each_nonfinite_float() -> None:
    assert [nonfinite_kind(x) for x in (math.nan, math.inf, -math.inf)] == ["nan", "inf", "-inf"]
    assert [nonfinite_kind(x) for x in (0.0, 1e308, 3, None, "NaN", True)] == [None] * 6
    assert [finite_or_none(x) for x in (math.nan, -math.inf, 2.5, None)] == [None, None, 2.5, None]


def test_metrics_keep_their_names() -> None:
    """Orbax's ``{"loss": NaN}`` and nested or listed metrics: each non-finite value null,
    its dotted path mapped to its kind; everything else unchanged."""
    value, where = split_nonfinite({"loss": math.nan, "acc": 0.5, "step": 3})
    assert (value, where) == ({"loss": None, "acc": 0.5, "step": 3}, {"loss": "nan"})
    value, where = split_nonfinite({"eval": {"loss": math.inf}, "hist": [1.0, -math.inf]})
    assert value == {"eval": {"loss": None}, "hist": [1.0, None]}
    assert where == {"eval.loss": "inf", "hist.1": "-inf"}
    json.dumps(value, allow_nan=False)  # strict JSON now


def test_finite_values_are_returned_as_they_are() -> None:
    metrics = {"loss": 0.25, "names": ["a", "b"]}
    value, where = split_nonfinite(metrics)
    assert value is metrics and where == {}
    assert split_nonfinite(None) == (None, {})
