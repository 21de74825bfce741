"""Retention rules: which committed steps a policy keeps, and the reasons for each (no I/O).

Rules are OR-ed, as in restic's ``forget`` and Orbax's preservation policies: a step is kept when
any rule keeps it, and every kept step carries the reasons that kept it. The newest committed step
(highest step number, as ``latest_committed``) is always kept. Time rules use each step's commit
time in UTC. Time buckets follow restic: walk the steps newest first and keep the newest step of
each distinct bucket until N buckets are kept; buckets without a step do not count. A NaN or
infinite metric ranks below every finite value in either mode (``finite.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

from ckpt_cli.core.prune.finite import nonfinite_metrics, number
from ckpt_cli.core.schema.finite import NonFinite, nonfinite_kind
from ckpt_cli.errors import UsageError

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11; checking only

Mode = Literal["min", "max"]

LATEST = "latest"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"^(?:\d+[smhdw])+$")
_PART_RE = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str, *, option: str = "duration") -> timedelta:
    """Parse ``90m``, ``36h``, ``7d``, ``2w`` or a sum such as ``1d12h``; a bare number is refused."""
    compact = text.strip().lower()
    if not _DURATION_RE.match(compact):
        raise UsageError(
            f"{option}: cannot read {text!r} as a duration",
            hint="use a number and a unit s, m, h, d or w, such as 90m, 36h, 7d, 2w",
        )
    try:
        seconds = sum(int(n) * _UNITS[unit] for n, unit in _PART_RE.findall(compact))
        return timedelta(seconds=seconds)
    except (ValueError, OverflowError):  # int() of 4,300 digits; past timedelta's 999,999,999 days
        raise UsageError(
            f"{option}: {text[:40]!r} is too long a duration",
            hint="durations go up to 2.7 million years (999,999,999 days)",
        ) from None


def format_duration(delta: timedelta) -> str:
    """The shortest exact spelling in one unit: ``36h``, ``7d``, ``2w``, ``90m``."""
    seconds = int(delta.total_seconds())
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def rough_duration(delta: timedelta) -> str:
    """An age for people, floored to its largest unit: ``3h``, ``45m``, ``12s``."""
    seconds = max(0, int(delta.total_seconds()))
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def _hour(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H")


def _day(t: datetime) -> str:
    return t.strftime("%Y-%m-%d")


def _week(t: datetime) -> str:
    year, week, _ = t.isocalendar()
    return f"{year}-W{week:02d}"


def _month(t: datetime) -> str:
    return t.strftime("%Y-%m")


_BUCKETS: tuple[tuple[str, Callable[[datetime], str]], ...] = (
    ("hourly", _hour),
    ("daily", _day),
    ("weekly", _week),
    ("monthly", _month),
)


_COUNTS = (
    "keep_last",
    "keep_last_finite",
    "keep_every",
    "keep_hourly",
    "keep_daily",
    "keep_weekly",
    "keep_monthly",
    "keep_best",
)


class PolicyRulesJSON(TypedDict):
    """The rules of a policy; the plan adds its clean-up of unfinished saves (``PolicyJSON``)."""

    keep_last: int | None
    keep_last_finite: int | None
    keep_every: int | None
    keep_hourly: int | None
    keep_daily: int | None
    keep_weekly: int | None
    keep_monthly: int | None
    keep_best: int | None
    keep_steps: list[int]
    keep_within: str | None
    metric: str | None
    mode: Literal["min", "max"] | None
    keep_missing_metric: bool | None


class PolicyRules(TypedDict, total=False):
    """A policy's rules as keywords (``Policy.from_rules``, ``ckpt_cli.plan_prune``,
    ``ckpt prune``'s flags): the fields of ``Policy``, where a rule not given or None is off.
    ``RULES`` names them; a test holds this, ``Policy`` and ``PolicyRulesJSON`` to one list."""

    keep_last: int | None
    keep_last_finite: int | None
    keep_every: int | None
    keep_steps: Iterable[int] | None
    keep_within: timedelta | None
    keep_hourly: int | None
    keep_daily: int | None
    keep_weekly: int | None
    keep_monthly: int | None
    keep_best: int | None
    metric: str | None
    mode: Mode | None
    keep_missing_metric: bool | None


@dataclass(frozen=True)
class Policy:
    """What to keep. Counts of 0 and ``None`` mean the rule is off."""

    keep_last: int = 0
    # The N newest steps whose metrics are all finite: what survives a run that diverged.
    keep_last_finite: int = 0
    keep_every: int = 0
    keep_steps: frozenset[int] = field(default_factory=frozenset)
    keep_within: timedelta | None = None
    keep_hourly: int = 0
    keep_daily: int = 0
    keep_weekly: int = 0
    keep_monthly: int = 0
    keep_best: int = 0
    metric: str | None = None
    # Required with keep_best: Orbax's best_mode defaults to "max", a loss wants "min"; either
    # default would silently delete the best steps of half the users.
    mode: Mode | None = None
    # Orbax's `keep_checkpoints_without_metrics` defaults to True; losing a step because a metric
    # was not logged is the surprising outcome, so keeping is the default here too.
    keep_missing_metric: bool = True

    def __post_init__(self) -> None:
        for name in _COUNTS:
            if getattr(self, name) < 0:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} must be a positive number, not {getattr(self, name)}")
        if self.keep_within is not None and self.keep_within <= timedelta(0):
            raise UsageError("--keep-within must be longer than zero")
        if self.keep_best and not self.metric:
            raise UsageError(
                "--keep-best needs the metric to rank by",
                hint="add --metric NAME --mode min|max; NAME is a key of each step's metrics, such "
                "as loss, read from the step's metrics/metrics or _CHECKPOINT_METADATA",
            )
        if self.metric and not self.keep_best:
            raise UsageError("--metric only applies to --keep-best", hint="add --keep-best N")
        if self.keep_best and self.mode is None:
            raise UsageError(
                "--keep-best needs --mode: min (lower is better, a loss) or max (higher is "
                "better, an accuracy; Orbax's best_mode default)",
                hint="ckpt never guesses which steps are best: a wrong guess deletes them",
            )
        if self.mode is not None and self.mode not in ("min", "max"):
            raise UsageError(f"--mode must be min or max, not {self.mode!r}")

    @classmethod
    def from_rules(cls, **rules: Unpack[PolicyRules]) -> Policy:
        """The policy of the rules given, as options arrive (a rule not given or None is off,
        ``keep_missing_metric`` at its default)."""
        given: dict[str, Any] = {name: value for name, value in rules.items() if value is not None}
        if "keep_steps" in given:
            given["keep_steps"] = frozenset(given["keep_steps"])
        return cls(**given)

    @property
    def is_empty(self) -> bool:
        return not any(getattr(self, name) for name in (*_COUNTS, "keep_steps", "keep_within"))

    def to_json(self) -> PolicyRulesJSON:
        best = bool(self.keep_best)
        # The counts in _COUNTS' order; 0 (off) shows as null.
        return {
            "keep_last": self.keep_last or None,
            "keep_last_finite": self.keep_last_finite or None,
            "keep_every": self.keep_every or None,
            "keep_hourly": self.keep_hourly or None,
            "keep_daily": self.keep_daily or None,
            "keep_weekly": self.keep_weekly or None,
            "keep_monthly": self.keep_monthly or None,
            "keep_best": self.keep_best or None,
            "keep_steps": sorted(self.keep_steps),
            "keep_within": format_duration(self.keep_within) if self.keep_within else None,
            "metric": self.metric,
            "mode": self.mode if best else None,
            "keep_missing_metric": self.keep_missing_metric if best else None,
        }


#: The names of the rules, in ``Policy``'s order: what ``plan_prune`` passes on to ``from_rules``.
RULES: tuple[str, ...] = tuple(f.name for f in fields(Policy))


class MetricJSON(TypedDict):
    """The value ``--keep-best`` ranked a step by, and its rank (1 = best). ``value`` is null
    when the step lacks the metric and when it is NaN or infinite; ``value_nonfinite`` tells
    them apart (``"nan"``, ``"inf"``, ``"-inf"``; null for a finite or absent value). ``rank``
    is null for both: a non-finite value ranks below every finite one and is never kept as
    best."""

    name: str
    value: float | None
    value_nonfinite: NonFinite | None
    rank: int | None


@dataclass(frozen=True)
class MetricRank:
    """A step's value of the ``--keep-best`` metric (None: absent; NaN and infinities as they
    are) and its rank among the steps with a finite value (1 = best)."""

    name: str
    value: float | None
    rank: int | None

    @property
    def nonfinite(self) -> NonFinite | None:
        return None if self.value is None else nonfinite_kind(self.value)

    def to_json(self) -> MetricJSON:
        kind = self.nonfinite
        value = None if kind else self.value
        return {"name": self.name, "value": value, "value_nonfinite": kind, "rank": self.rank}


class Candidate(Protocol):
    """What a rule looks at: ``StepInfo`` satisfies it, and so does any synthetic test step."""

    @property
    def step(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def committed_at(self) -> datetime: ...

    @property
    def metrics(self) -> dict[str, Any] | None: ...


def metric_value(metrics: dict[str, Any] | None, name: str) -> float | None:
    """The number under ``name``, NaN and infinities included; anything else (absent, text,
    bool) is missing."""
    return number((metrics or {}).get(name))


#: One rule keeping one step: the rule as given (``--keep-last 2``; ``latest`` for the newest
#: step), the step, and the reason the plan shows.
Grant = tuple[str, Candidate, str]

#: The rules that pick steps without looking at them: the ones that can keep only the steps
#: past a divergence (``rule_keeps``).
_BLIND_RULES = (
    "--keep-last ",
    "--keep-every ",
    "--keep-within ",
    "--keep-hourly ",
    "--keep-daily ",
    "--keep-weekly ",
    "--keep-monthly ",
)


def keep_reasons(
    steps: Sequence[Candidate], policy: Policy, now: datetime
) -> dict[str, tuple[str, ...]]:
    """The kept steps of ``steps`` (committed steps of one root), by directory name, with reasons.

    Steps absent from the result are the ones the policy deletes.
    """
    reasons: dict[str, list[str]] = {}
    for _, s, why in _grants(steps, policy, now):
        reasons.setdefault(s.name, []).append(why)
    return {name: tuple(why) for name, why in reasons.items()}


def rule_keeps(steps: Sequence[Candidate], policy: Policy, now: datetime) -> dict[str, list[str]]:
    """The steps each counting or time rule keeps, by the rule as given (``--keep-last 2``):
    the rules that pick steps without looking at them, which can keep only the steps past a
    divergence. Not ``latest`` (always kept), ``--keep-step`` (chosen by number),
    ``--keep-best`` or ``--keep-last-finite`` (which look at the metrics)."""
    out: dict[str, list[str]] = {}
    for rule, s, _ in _grants(steps, policy, now):
        if rule.startswith(_BLIND_RULES) and s.name not in out.setdefault(rule, []):
            out[rule].append(s.name)
    return out


def _grants(steps: Sequence[Candidate], policy: Policy, now: datetime) -> list[Grant]:
    """Every (rule, step, reason) of the policy over ``steps``, rule by rule."""
    by_step = sorted(steps, key=lambda s: (s.step, s.committed_at, s.name))
    out: list[Grant] = []
    if by_step:
        out.append((LATEST, by_step[-1], LATEST))
    if policy.keep_last:
        rule = f"--keep-last {policy.keep_last}"
        out += [(rule, s, f"last {policy.keep_last}") for s in by_step[-policy.keep_last :]]
    if policy.keep_last_finite:
        out += _last_finite(by_step, policy.keep_last_finite)
    for s in by_step:
        if policy.keep_every and s.step % policy.keep_every == 0:
            out.append((f"--keep-every {policy.keep_every}", s, f"every {policy.keep_every}"))
        if s.step in policy.keep_steps:
            out.append(("--keep-step", s, f"step {s.step}"))
        if policy.keep_within is not None and now - s.committed_at <= policy.keep_within:
            within = format_duration(policy.keep_within)
            out.append((f"--keep-within {within}", s, f"within {within}"))
    out += _buckets(steps, policy)
    if policy.keep_best and policy.metric:
        out += _keep_best(by_step, policy, policy.metric)
    return out


def _last_finite(by_step: list[Candidate], n: int) -> list[Grant]:
    """The ``n`` newest steps whose metrics are all finite; steps that record none are not
    counted (they cannot be judged)."""
    finite = [s for s in by_step if nonfinite_metrics(s.metrics) == ()]
    return [(f"--keep-last-finite {n}", s, f"last {n} finite") for s in finite[-n:]]


def _buckets(steps: Sequence[Candidate], policy: Policy) -> list[Grant]:
    """Restic's time buckets: the newest step of each of the last N buckets that have one."""
    newest_first = sorted(steps, key=lambda s: (s.committed_at, s.step, s.name), reverse=True)
    out: list[Grant] = []
    for label, bucket_of in _BUCKETS:
        left = count = getattr(policy, f"keep_{label}")
        last: str | None = None
        for s in newest_first:
            if left <= 0:
                break
            bucket = bucket_of(s.committed_at.astimezone(timezone.utc))
            if bucket != last:
                out.append((f"--keep-{label} {count}", s, f"{label} {bucket}"))
                last, left = bucket, left - 1
    return out


def metric_ranks(steps: Sequence[Candidate], policy: Policy) -> dict[str, MetricRank]:
    """With ``keep_best``: every step's value of the metric and its rank (1 = best), by
    directory name. Only finite values are ranked: a NaN or infinite value, in either mode,
    ranks below every finite one (rank None, its value kept as it is); an absent value has
    neither value nor rank."""
    if not (policy.keep_best and policy.metric):
        return {}
    metric = policy.metric
    ranked: list[tuple[float, int, Candidate]] = []
    out: dict[str, MetricRank] = {}
    for s in steps:
        value = metric_value(s.metrics, metric)
        if value is None or nonfinite_kind(value):
            out[s.name] = MetricRank(metric, value, None)
            continue
        # Best first; on a tie the newer step wins, as Orbax's stable sort does.
        ranked.append((value if policy.mode == "min" else -value, -s.step, s))
    ranked.sort(key=lambda r: (r[0], r[1]))
    for i, (_, _, s) in enumerate(ranked, start=1):
        out[s.name] = MetricRank(metric, metric_value(s.metrics, metric), i)
    return out


def _keep_best(by_step: list[Candidate], policy: Policy, metric: str) -> list[Grant]:
    """The best steps; with ``keep_missing_metric`` the steps without the metric too (a NaN is
    not missing: the run recorded it, and it is the worst value there is)."""
    ranks = metric_ranks(by_step, policy)
    rule = f"--keep-best {policy.keep_best}"
    out: list[Grant] = []
    for s in by_step:
        rank = ranks[s.name]
        if rank.value is None and policy.keep_missing_metric:
            out.append((rule, s, f"no {metric} metric"))
        elif rank.rank is not None and rank.rank <= policy.keep_best:
            out.append((rule, s, f"best {policy.keep_best} by {metric} ({policy.mode})"))
    return out
