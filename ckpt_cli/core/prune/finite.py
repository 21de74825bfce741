"""Finite or not: what a step's recorded metrics say about a diverged run, and what a prune
plan warns when its rules keep only the steps past the divergence (no I/O).

Orbax's ``JsonCheckpointHandler`` writes metrics with Python's ``json``, which writes a NaN as
the bare token ``NaN`` (``Infinity``, ``-Infinity``): ``{"loss": NaN}``, read back as a float
NaN. A NaN or infinite metric is a value, not a missing one: it ranks below every finite value
and is shown as what it is (``nan``, ``inf``, ``-inf``); strict JSON writes it as ``null`` beside
a key naming the kind (``"value_nonfinite": "nan"``: the convention of every document,
``core/schema/finite.py``).

A step is judged by every number in its metrics (nested objects and arrays included, under
dotted names): finite when all are finite, non-finite when one is not, unknown when it records
no number. The judgement reads metrics only, not the arrays: a loss is measured before its
step's update, so the first step whose parameters are NaN usually still records a finite loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ckpt_cli.core.schema.finite import NonFinite, nonfinite_kind
from ckpt_cli.errors import UsageError

#: A step's non-finite metrics, by dotted name: ``()`` all finite; None: it records no number.
Judgement = tuple[tuple[str, NonFinite], ...] | None

_SHOWN_STEPS = 6
_KIND_TEXT = {"nan": "NaN", "inf": "inf", "-inf": "-inf"}


class Judged(Protocol):
    """What the judgement looks at (``StepInfo`` and ``policy.Candidate`` satisfy it)."""

    @property
    def step(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def metrics(self) -> dict[str, Any] | None: ...


def number(value: Any) -> float | None:
    """A JSON number as a float, NaN and infinities included; None for anything else (absent,
    text, bool, an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def format_value(value: float) -> str:
    """A metric for people: 4 significant digits, ``nan``/``inf``/``-inf`` as they are."""
    return nonfinite_kind(value) or f"{value:.4g}"


def numbers(metrics: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """Every number in ``metrics``, by dotted name (``eval.loss``, ``losses.0``)."""
    if isinstance(metrics, Mapping):
        for key, value in metrics.items():
            yield from numbers(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(metrics, (list, tuple)):
        for i, value in enumerate(metrics):
            yield from numbers(value, f"{prefix}.{i}" if prefix else str(i))
    else:
        value = number(metrics)
        if value is not None and prefix:
            yield prefix, value


def nonfinite_metrics(metrics: Any) -> Judgement:
    """The metrics that are NaN or infinite, by dotted name: ``()`` when every number is finite,
    None when ``metrics`` holds no number at all (the step cannot be judged)."""
    found = list(numbers(metrics))
    if not found:
        return None
    return tuple((name, kind) for name, value in found if (kind := nonfinite_kind(value)))


def require_metrics(steps: Sequence[Judged], root: str) -> None:
    """Refuse ``--keep-last-finite`` on a root whose committed steps record no number: every
    step would be unknown, and the rule would keep nothing while seeming to keep the healthy."""
    if not steps or any(nonfinite_metrics(s.metrics) is not None for s in steps):
        return
    raise UsageError(
        f"--keep-last-finite judges steps by their metrics, and no committed step of {root} "
        "records one",
        hint=f"`ckpt trend {root}` reads the values and names the last step without NaN/Inf: "
        "keep it with --keep-step N",
    )


def _steps_text(steps: Iterable[int]) -> str:
    shown = sorted(steps)
    text = ", ".join(str(s) for s in shown[:_SHOWN_STEPS])
    return text + (f" and {len(shown) - _SHOWN_STEPS} more" if len(shown) > _SHOWN_STEPS else "")


def _whose(judged: Iterable[Judgement]) -> tuple[str, list[str]]:
    """How to name what a set of non-finite steps have wrong, and the metric names involved."""
    pairs = {pair for j in judged for pair in j or ()}
    names = sorted({name for name, _ in pairs})
    kinds = {kind for _, kind in pairs}
    if len(names) == 1 and len(kinds) == 1:
        return f"whose {names[0]} is {_KIND_TEXT[kinds.pop()]}", names
    if len(names) == 1:
        return f"whose {names[0]} is NaN or infinite", names
    return "with a NaN or infinite metric", names


def divergence_warnings(
    steps: Sequence[Judged],
    rules: Mapping[str, Sequence[str]],
    kept: frozenset[str],
    keep_last_finite: int = 0,
) -> list[str]:
    """What a plan warns about a diverged run: each rule (``rules``: its flag -> the names of
    the steps it keeps) that keeps only non-finite steps while the newest finite step is
    deleted (``kept``: the names the plan keeps), and a ``--keep-last-finite`` that finds fewer
    finite steps than it asks for."""
    judged = {s.name: nonfinite_metrics(s.metrics) for s in steps}
    finite = sorted((s for s in steps if judged[s.name] == ()), key=lambda s: s.step)
    out = _shortfall(finite, keep_last_finite) if keep_last_finite else []
    if not finite or finite[-1].name in kept:
        return out
    by_name = {s.name: s for s in steps}
    for flag, names in rules.items():
        if names and all(judged[n] for n in names):
            out.append(_rule_warning(flag, [by_name[n] for n in names], judged, finite, kept))
    return out


def _rule_warning(
    flag: str,
    bad: list[Judged],
    judged: Mapping[str, Judgement],
    finite: list[Judged],
    kept: frozenset[str],
) -> str:
    whose, names = _whose(judged[s.name] for s in bad)
    newest = finite[-1]
    values = dict(numbers(newest.metrics))
    shown = ", ".join(f"{n} {format_value(values[n])}" for n in names[:2] if n in values)
    about = f"{newest.step} ({shown})" if shown else str(newest.step)
    lead = f"{flag} keeps only steps {whose} ({_steps_text(s.step for s in bad)})"
    if any(s.name in kept for s in finite):
        lead += f" and deletes the newest step whose metrics are all finite, {about}"
    else:
        lead += f" and deletes every step whose metrics are all finite, the newest being {about}"
    two = finite[-2:]
    if len(two) == 2:
        fix = f"add --keep-last-finite 2 to keep {two[0].step} and {two[1].step}"
    else:
        fix = "add --keep-last-finite 1 to keep it"
    return (
        f"{lead}: {fix} (a metric is measured before its step's update, so {newest.step} may "
        "already hold NaN values; `ckpt trend` reads them)"
    )


def _shortfall(finite: list[Judged], wanted: int) -> list[str]:
    if len(finite) >= wanted:
        return []
    if not finite:
        return [
            f"--keep-last-finite {wanted} keeps no step: every committed step that records "
            "metrics has a NaN or infinite one"
        ]
    return [
        f"--keep-last-finite {wanted} keeps {len(finite)}: only step"
        f"{'s' if len(finite) > 1 else ''} {_steps_text(s.step for s in finite)} record"
        f"{'' if len(finite) > 1 else 's'} metrics that are all finite"
    ]
