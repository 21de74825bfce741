"""Retention rules on synthetic steps: every rule and their combinations against exact keep sets."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from ckpt_cli.core.prune.policy import (
    Policy,
    format_duration,
    keep_reasons,
    parse_duration,
    rough_duration,
)
from ckpt_cli.errors import EXIT_USAGE, UsageError
from tests.support.retention_steps import NOW, S, hourly_steps, kept

STEPS = hourly_steps(10)  # 100 .. 1000, one hour apart


def test_keep_last() -> None:
    reasons = keep_reasons(STEPS, Policy(keep_last=3), NOW)
    assert set(reasons) == {"800", "900", "1000"}
    assert reasons["1000"] == ("latest", "last 3")
    assert reasons["800"] == ("last 3",)


def test_keep_last_more_than_there_are() -> None:
    assert kept(STEPS, Policy(keep_last=50)) == {s.step for s in STEPS}


def test_keep_every_is_orbax_keep_period() -> None:
    reasons = keep_reasons(STEPS, Policy(keep_every=300), NOW)
    assert set(reasons) == {"300", "600", "900", "1000"}
    assert reasons["1000"] == ("latest",)
    assert reasons["600"] == ("every 300",)


def test_keep_step_repeatable_and_missing_steps_ignored() -> None:
    reasons = keep_reasons(STEPS, Policy(keep_steps=frozenset({200, 500, 12345})), NOW)
    assert set(reasons) == {"200", "500", "1000"}
    assert reasons["500"] == ("step 500",)


def test_keep_within_uses_commit_time_and_is_inclusive() -> None:
    # 1000 is at NOW, 900 one hour before, ... 700 exactly 3h before.
    assert kept(STEPS, Policy(keep_within=timedelta(hours=3))) == {700, 800, 900, 1000}
    assert kept(STEPS, Policy(keep_within=timedelta(hours=2, minutes=59))) == {800, 900, 1000}


def test_keep_within_old_run_still_keeps_latest() -> None:
    old = [S(s.step, s.committed_at - timedelta(days=30)) for s in STEPS]
    reasons = keep_reasons(old, Policy(keep_within=timedelta(days=7)), NOW)
    assert reasons == {"1000": ("latest",)}


def test_keep_hourly_newest_of_each_hour() -> None:
    # Every 20 minutes over 5 hours: three steps per hour.
    steps = hourly_steps(15, every=timedelta(minutes=20))
    reasons = keep_reasons(steps, Policy(keep_hourly=3), NOW)
    # NOW=12:00 is alone in its hour; 11:40 is the newest of 11h, 10:40 of 10h.
    by_time = {s.name: s.committed_at.strftime("%H:%M") for s in steps}
    assert {by_time[n] for n in reasons} == {"12:00", "11:40", "10:40"}
    assert reasons[next(n for n, t in by_time.items() if t == "11:40")] == ("hourly 2024-03-15T11",)


def test_keep_daily_counts_only_days_that_have_steps() -> None:
    # restic: the last N days *with* steps, so the gap (days 3, 4) is skipped.
    day = lambda d, h: datetime(2024, 3, d, h, tzinfo=timezone.utc)  # noqa: E731
    steps = [
        S(10, day(1, 9)),
        S(20, day(1, 18)),
        S(30, day(2, 9)),
        S(40, day(2, 20)),
        S(50, day(5, 8)),
        S(60, day(6, 7)),
        S(70, day(6, 23)),
    ]
    reasons = keep_reasons(steps, Policy(keep_daily=3), NOW)
    assert set(reasons) == {"40", "50", "70"}
    assert reasons["40"] == ("daily 2024-03-02",)
    assert reasons["70"] == ("latest", "daily 2024-03-06")


def test_keep_daily_buckets_are_utc_days() -> None:
    # 23:30 at UTC-5 on the 1st is 04:30 UTC on the 2nd.
    eastern = timezone(timedelta(hours=-5))
    steps = [
        S(1, datetime(2024, 3, 2, 1, 0, tzinfo=timezone.utc)),
        S(2, datetime(2024, 3, 1, 23, 30, tzinfo=eastern)),
        S(3, datetime(2024, 3, 3, 1, 0, tzinfo=timezone.utc)),
    ]
    reasons = keep_reasons(steps, Policy(keep_daily=2), NOW)
    assert set(reasons) == {"2", "3"}
    assert reasons["2"] == ("daily 2024-03-02",)


def test_keep_weekly_uses_iso_weeks_across_new_year() -> None:
    d = lambda y, m, day: datetime(y, m, day, 12, tzinfo=timezone.utc)  # noqa: E731
    steps = [
        S(1, d(2020, 12, 20)),  # 2020-W51
        S(2, d(2020, 12, 28)),  # 2020-W53
        S(3, d(2020, 12, 31)),  # 2020-W53
        S(4, d(2021, 1, 3)),  # 2020-W53 (a Sunday)
        S(5, d(2021, 1, 4)),  # 2021-W01
    ]
    reasons = keep_reasons(steps, Policy(keep_weekly=3), NOW)
    assert set(reasons) == {"1", "4", "5"}
    assert reasons["4"] == ("weekly 2020-W53",)


def test_keep_monthly() -> None:
    steps = [
        S(i, datetime(2023, month, day, tzinfo=timezone.utc))
        for i, (month, day) in enumerate([(1, 5), (1, 30), (2, 2), (4, 1), (4, 9)], 1)
    ]
    assert kept(steps, Policy(keep_monthly=2)) == {3, 5}
    assert kept(steps, Policy(keep_monthly=10)) == {2, 3, 5}


def test_buckets_follow_commit_time_not_step_order() -> None:
    # A run that restarted from an earlier step: step 50 was committed after step 90.
    steps = [
        S(90, datetime(2024, 3, 1, 10, tzinfo=timezone.utc)),
        S(50, datetime(2024, 3, 1, 22, tzinfo=timezone.utc)),
        S(60, datetime(2024, 3, 2, 1, tzinfo=timezone.utc)),
    ]
    reasons = keep_reasons(steps, Policy(keep_daily=2), NOW)
    assert reasons["50"] == ("daily 2024-03-01",)
    assert reasons["90"] == ("latest",)  # the highest step is the latest, as Orbax sees it
    assert set(reasons) == {"50", "60", "90"}


def with_loss(values: list[Any]) -> list[S]:
    return [
        S(10 * (i + 1), NOW - timedelta(hours=len(values) - i), None if v is None else {"loss": v})
        for i, v in enumerate(values)
    ]


def test_keep_best_min_and_max() -> None:
    steps = with_loss([0.9, 0.3, 0.5, 0.1, 0.7, 0.8])
    reasons = keep_reasons(steps, Policy(keep_best=2, metric="loss", mode="min"), NOW)
    assert set(reasons) == {"20", "40", "60"}
    assert reasons["40"] == ("best 2 by loss (min)",)
    assert reasons["60"] == ("latest",)
    assert kept(steps, Policy(keep_best=2, metric="loss", mode="max")) == {10, 60}


def test_keep_best_tie_prefers_the_newer_step() -> None:
    steps = with_loss([0.2, 0.5, 0.2, 0.9])
    assert kept(steps, Policy(keep_best=1, metric="loss", mode="min")) == {30, 40}


def test_keep_best_missing_metric_kept_by_default_and_droppable() -> None:
    steps = with_loss([0.4, None, 0.1, float("nan"), "n/a", True, 0.3, 0.6])
    reasons = keep_reasons(steps, Policy(keep_best=1, metric="loss", mode="min"), NOW)
    # None, text and bool are "missing"; kept with the reason saying so. A NaN is not missing:
    # it is the worst value there is, and goes (step 40).
    assert set(reasons) == {"20", "30", "50", "60", "80"}
    assert reasons["20"] == ("no loss metric",)
    dropped = Policy(keep_best=1, metric="loss", mode="min", keep_missing_metric=False)
    assert kept(steps, dropped) == {30, 80}


def test_keep_best_other_metric_name_is_missing() -> None:
    steps = with_loss([0.4, 0.1, 0.3])
    policy = Policy(keep_best=1, metric="accuracy", mode="max", keep_missing_metric=False)
    assert kept(steps, policy) == {30}


def test_latest_always_kept_even_when_worst() -> None:
    steps = with_loss([0.1, 0.2, 0.9])
    reasons = keep_reasons(
        steps, Policy(keep_best=1, metric="loss", mode="min", keep_missing_metric=False), NOW
    )
    assert reasons == {"10": ("best 1 by loss (min)",), "30": ("latest",)}


def test_rules_are_ored_and_every_reason_is_listed() -> None:
    steps = [S(s.step, s.committed_at, {"loss": 1000 / s.step}) for s in hourly_steps(20)]
    policy = Policy(
        keep_last=2,
        keep_every=500,
        keep_steps=frozenset({300}),
        keep_within=timedelta(hours=4),
        keep_best=1,
        metric="loss",
        mode="max",
    )
    reasons = keep_reasons(steps, policy, NOW)
    assert {int(n) for n in reasons} == {100, 300, 500, 1000, 1500, 1600, 1700, 1800, 1900, 2000}
    assert reasons["2000"] == ("latest", "last 2", "every 500", "within 4h")
    assert reasons["100"] == ("best 1 by loss (max)",)
    assert reasons["1500"] == ("every 500",)
    assert reasons["1600"] == ("within 4h",)


def test_many_steps() -> None:
    steps = hourly_steps(5000, every=timedelta(minutes=7), start=0)
    policy = Policy(keep_last=3, keep_every=100_000, keep_daily=2)
    got = kept(steps, policy)
    last_day = {s for s in steps if s.committed_at.date() == NOW.date()}
    prev_day = [s for s in steps if s.committed_at.date() == (NOW - timedelta(days=1)).date()]
    expected = {0, 100_000, 200_000, 300_000, 400_000, 499_700, 499_800, 499_900}
    expected.add(max(prev_day, key=lambda s: s.committed_at).step)
    assert last_day and got == expected


def test_no_steps_keeps_nothing() -> None:
    assert keep_reasons([], Policy(keep_last=3), NOW) == {}


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [
        ({"keep_best": 2}, "--keep-best needs the metric"),
        ({"metric": "loss", "keep_last": 1}, "--metric only applies to --keep-best"),
        ({"keep_last": -1}, "--keep-last must be a positive number"),
        ({"keep_within": timedelta(0)}, "--keep-within must be longer than zero"),
    ],
)
def test_policy_refuses_impossible_combinations(kwargs: dict[str, Any], phrase: str) -> None:
    with pytest.raises(UsageError, match=phrase) as info:
        Policy(**kwargs)
    assert info.value.exit_code == EXIT_USAGE


def test_empty_policy() -> None:
    assert Policy().is_empty
    assert not Policy(keep_steps=frozenset({1})).is_empty


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("36h", 129600),
        ("7d", 604800),
        ("2w", 1209600),
        ("1d12h", 129600),
        (" 45S ", 45),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "7", "7 days", "-1h", "1.5h", "h", "7d-"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="--keep-within: cannot read"):
        parse_duration(text, option="--keep-within")


def test_format_and_rough_durations() -> None:
    assert [format_duration(parse_duration(t)) for t in ("36h", "14d", "90m", "61s")] == [
        "36h",
        "2w",
        "90m",
        "61s",
    ]
    assert rough_duration(timedelta(hours=3, minutes=12)) == "3h"
    assert rough_duration(timedelta(seconds=-5)) == "0s"


# --- one source of the rules: Policy's fields ----------------------------------------------------


def test_the_rules_are_named_once_by_policys_fields() -> None:
    """``Policy``'s fields are the rules; the keywords (``PolicyRules``), the JSON document and
    ``ckpt_cli.plan_prune``'s keywords name the same ones, so a rule added to ``Policy`` and
    missed elsewhere fails here, not in a user's call."""
    import inspect

    import ckpt_cli
    from ckpt_cli.core.prune.policy import RULES, PolicyRules, PolicyRulesJSON

    assert len(RULES) == 13 and RULES[:2] == ("keep_last", "keep_last_finite")
    assert tuple(PolicyRules.__annotations__) == RULES
    assert set(PolicyRulesJSON.__annotations__) == set(RULES)
    keywords = [
        p.name
        for p in inspect.signature(ckpt_cli.plan_prune).parameters.values()
        if p.kind is p.KEYWORD_ONLY
    ]
    assert keywords[: len(RULES)] == list(RULES)
    assert keywords[len(RULES) :] == ["clean_tmp", "tmp_min_age", "now", "storage"]


def test_from_rules_turns_rules_not_given_off() -> None:
    from ckpt_cli.core.prune.policy import Policy

    assert Policy.from_rules() == Policy()
    assert Policy.from_rules(keep_last=None, keep_missing_metric=None) == Policy()
    policy = Policy.from_rules(keep_steps=[300, 100], keep_best=2, metric="loss", mode="min")
    assert policy.keep_steps == frozenset({100, 300}) and policy.keep_best == 2
    assert Policy.from_rules(keep_best=1, metric="loss", mode="min", keep_missing_metric=False) == (
        Policy(keep_best=1, metric="loss", mode="min", keep_missing_metric=False)
    )
    with pytest.raises(TypeError):
        Policy.from_rules(keep_lats=2)  # type: ignore[call-arg]
