"""Which steps of a root ``ckpt cp`` takes: ``--step N`` (repeatable), ``--steps 100-300,500``
(``core/step_ranges.py``, which ``trend`` shares), ``ROOT@STEP`` / ``ROOT@A-B`` and
``--latest``."""

from __future__ import annotations

from ckpt_cli.core.step_ranges import StepSelection, parse_steps
from ckpt_cli.errors import UsageError


def combine(
    steps: list[int] | None, ranges: str | None, latest: bool, at: str | None
) -> StepSelection:
    """One selection from ``--step``, ``--steps``, ``--latest`` and a ``ROOT@...`` suffix."""
    given = [name for name, v in (("--step", steps), ("--steps", ranges), ("ROOT@STEPS", at)) if v]
    if latest and given:
        raise UsageError(f"--latest and {given[0]} both choose steps: pass one of them")
    if at and (steps or ranges):
        raise UsageError(f"the source names its steps (@{at}); do not also pass {given[0]}")
    sel = (
        parse_steps(at, "ROOT@STEPS")
        if at
        else (parse_steps(ranges) if ranges else StepSelection())
    )
    singles = tuple(dict.fromkeys([*sel.singles, *(steps or ())]))
    return StepSelection(sel.ranges, singles, latest)
