"""Non-finite metrics on synthetic steps: the judgement, the ranking, ``--keep-last-finite`` and
the warnings a plan gives about a run that diverged."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from ckpt_cli.core.prune.finite import (
    divergence_warnings,
    format_value,
    nonfinite_metrics,
    require_metrics,
)
from ckpt_cli.core.prune.policy import MetricRank, Policy, keep_reasons, metric_ranks, rule_keeps
from ckpt_cli.errors import UsageError
from tests.support.retention_steps import NOW, S, kept

NAN, INF = float("nan"), float("inf")


def run(metrics: list[Any]) -> list[S]:
    """Steps 1, 2, ... an hour apart (the last at NOW), each with the metrics given."""
    n = len(metrics)
    return [S(i + 1, NOW - timedelta(hours=n - 1 - i), m) for i, m in enumerate(metrics)]


def losses(*values: Any) -> list[S]:
    return run([None if v is None else {"loss": v} for v in values])


# A run that diverges at step 4 (its loss, measured before the update, is already NaN).
DIVERGED = losses(0.9, 0.5, 0.4, NAN, NAN, NAN)


def test_the_judgement_reads_every_number_of_the_metrics() -> None:
    assert nonfinite_metrics({"loss": 0.3, "acc": 1}) == ()
    assert nonfinite_metrics({"loss": NAN, "acc": INF, "lr": -INF}) == (
        ("loss", "nan"),
        ("acc", "inf"),
        ("lr", "-inf"),
    )
    nested = {"eval": {"loss": NAN, "n": 3}, "losses": [0.1, -INF], "tag": "run7"}
    assert nonfinite_metrics(nested) == (("eval.loss", "nan"), ("losses.1", "-inf"))
    # Nothing to judge: no metrics, or metrics without a number (text, bool, null).
    for nothing in (None, {}, {"tag": "x", "done": True, "note": None}):
        assert nonfinite_metrics(nothing) is None
    # As Orbax writes them: Python's json, bare NaN/Infinity tokens.
    assert nonfinite_metrics(json.loads('{"loss": NaN, "gn": Infinity}')) == (
        ("loss", "nan"),
        ("gn", "inf"),
    )
    assert [format_value(v) for v in (0.52528, NAN, INF, -INF)] == ["0.5253", "nan", "inf", "-inf"]


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_keep_best_ranks_a_nonfinite_value_below_every_finite_one(mode: str, bad: float) -> None:
    """Whatever the mode and the sign: inf is not the best loss, -inf not the best accuracy."""
    steps = losses(0.9, bad, 0.5, bad, 0.7, 0.8)
    policy = Policy(keep_best=2, metric="loss", mode=mode)  # type: ignore[arg-type]
    reasons = keep_reasons(steps, policy, NOW)
    assert set(reasons) == ({"3", "5", "6"} if mode == "min" else {"1", "6"})
    ranks = metric_ranks(steps, policy)
    assert [ranks[str(s)].rank for s in (2, 4)] == [None, None]
    assert [ranks[str(s)].rank for s in (1, 3, 5, 6)] == (
        [4, 1, 2, 3] if mode == "min" else [1, 4, 3, 2]
    )
    assert ranks["2"].nonfinite == format_value(bad)
    # Fewer finite steps than asked for: the non-finite ones are still not "best".
    assert kept(steps, Policy(keep_best=10, metric="loss", mode=mode)) == {1, 3, 5, 6}  # type: ignore[arg-type]


def test_a_nonfinite_value_is_not_a_missing_one() -> None:
    steps = losses(0.3, None, NAN, 0.1)
    reasons = keep_reasons(steps, Policy(keep_best=1, metric="loss", mode="min"), NOW)
    assert reasons == {"2": ("no loss metric",), "4": ("latest", "best 1 by loss (min)")}


def test_metric_rank_json_names_the_nonfinite_kind_beside_a_null_value() -> None:
    docs = [MetricRank("loss", v, r).to_json() for v, r in ((0.25, 1), (NAN, None), (None, None))]
    assert docs == [
        {"name": "loss", "value": 0.25, "value_nonfinite": None, "rank": 1},
        {"name": "loss", "value": None, "value_nonfinite": "nan", "rank": None},
        {"name": "loss", "value": None, "value_nonfinite": None, "rank": None},
    ]
    assert MetricRank("acc", -INF, None).to_json()["value_nonfinite"] == "-inf"
    json.dumps(docs, allow_nan=False)  # strict JSON: no bare NaN


def test_keep_last_finite_keeps_the_newest_steps_whose_metrics_are_all_finite() -> None:
    reasons = keep_reasons(DIVERGED, Policy(keep_last_finite=2), NOW)
    assert reasons == {"2": ("last 2 finite",), "3": ("last 2 finite",), "6": ("latest",)}
    # Every number counts, not one metric; a step without metrics is not counted.
    steps = run([{"loss": 0.5}, {"loss": 0.4, "gn": INF}, None, {"loss": 0.3}, {"loss": NAN}])
    assert kept(steps, Policy(keep_last_finite=2)) == {1, 4, 5}
    assert Policy(keep_last_finite=3).to_json()["keep_last_finite"] == 3
    with pytest.raises(UsageError, match="--keep-last-finite must be a positive number"):
        Policy(keep_last_finite=-1)


def test_keep_last_finite_refuses_a_root_whose_steps_record_no_metric() -> None:
    with pytest.raises(UsageError, match="no committed step of /r records one") as err:
        require_metrics(losses(None, None), "/r")
    assert "ckpt trend /r" in (err.value.hint or "")
    require_metrics(losses(None, 0.5), "/r")  # one step to judge is enough
    require_metrics([], "/r")  # nothing to prune: nothing to refuse


def _warnings(steps: list[S], policy: Policy) -> list[str]:
    names = frozenset(keep_reasons(steps, policy, NOW))
    rules = rule_keeps(steps, policy, NOW)
    return divergence_warnings(steps, rules, names, policy.keep_last_finite)


def test_a_rule_that_keeps_only_nonfinite_steps_says_so() -> None:
    assert _warnings(DIVERGED, Policy(keep_last=2)) == [
        "--keep-last 2 keeps only steps whose loss is NaN (5, 6) and deletes every step whose "
        "metrics are all finite, the newest being 3 (loss 0.4): add --keep-last-finite 2 to keep "
        "2 and 3 (a metric is measured before its step's update, so 3 may already hold NaN "
        "values; `ckpt trend` reads them)"
    ]
    # A finite step kept by another rule, but not the newest one: still said.
    both = _warnings(DIVERGED, Policy(keep_last=2, keep_every=2))
    assert len(both) == 1 and both[0].startswith("--keep-last 2 keeps only steps whose loss")
    assert "deletes the newest step whose metrics are all finite, 3 (loss 0.4)" in both[0]
    # One per rule; each names its own steps.
    two = _warnings(DIVERGED, Policy(keep_last=1, keep_within=timedelta(hours=1)))
    assert [w.split(" keeps")[0] for w in two] == ["--keep-last 1", "--keep-within 1h"]
    assert "(6)" in two[0] and "(5, 6)" in two[1]


@pytest.mark.parametrize(
    "policy",
    [
        Policy(keep_last=2, keep_last_finite=1),  # the fix the warning names
        Policy(keep_last=4),  # keeps step 3
        Policy(keep_best=1, metric="loss", mode="min"),  # looks at the metric
        Policy(keep_steps=frozenset({6})),  # a step chosen by number
    ],
)
def test_no_warning_when_the_newest_finite_step_stays_or_no_blind_rule_chose(
    policy: Policy,
) -> None:
    assert _warnings(DIVERGED, policy) == []


def test_warnings_name_other_kinds_and_other_metrics() -> None:
    inf = _warnings(losses(0.5, 0.4, INF), Policy(keep_last=1))
    assert "whose loss is inf (3)" in inf[0] and "keep-last-finite 2 to keep 1 and 2" in inf[0]
    mixed = run([{"loss": 0.4, "gn": 1.5}, {"loss": NAN, "gn": INF}])
    (w,) = _warnings(mixed, Policy(keep_last=1))
    assert "with a NaN or infinite metric (2)" in w
    assert "the newest being 1 (gn 1.5, loss 0.4): add --keep-last-finite 1 to keep it" in w


def test_keep_last_finite_short_of_steps_says_how_many_it_found() -> None:
    assert _warnings(DIVERGED, Policy(keep_last_finite=5)) == [
        "--keep-last-finite 5 keeps 3: only steps 1, 2, 3 record metrics that are all finite"
    ]
    assert _warnings(losses(NAN, NAN), Policy(keep_last_finite=1)) == [
        "--keep-last-finite 1 keeps no step: every committed step that records metrics has a "
        "NaN or infinite one"
    ]
