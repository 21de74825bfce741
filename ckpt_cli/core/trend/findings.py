"""What a run's figures say: non-finite values (an error), frozen and all-zero leaves, units
that became all zero, update ratios far from the leaf's median, norms that jump between listed
steps (warnings).

Only floating-point leaves are judged (integer leaves, a step counter, change by design).
Thresholds are ``TrendOptions``' (``--explode``, ``--vanish``, ``--norm-jump``,
``--dead-units``).
"""

from __future__ import annotations

import math
import statistics

from ckpt_cli.core.trend.types import Finding, LeafTrend, StepStats, TrendReport

#: Fewest update ratios of a leaf before one is judged against their median.
MIN_RATIOS = 3


def findings(report: TrendReport) -> tuple[Finding, ...]:
    """Every finding of the report's leaves: errors first, then by step and leaf order."""
    leaves = [lf for lf in report.leaves if lf.is_float and lf.steps]
    anything_moved = any((s.update_norm or 0.0) > 0 for lf in report.leaves for s in lf.steps)
    out: list[Finding] = []
    for leaf in leaves:
        out += _nonfinite(leaf)
        zero = _zero(leaf)
        out += zero
        if not zero and anything_moved:
            out += _frozen(leaf)
        out += _dead(leaf, report.options.dead_units)
        out += _ratios(leaf, report.options.explode, report.options.vanish)
        out += _jumps(leaf, report.options.norm_jump)
    order = {lf.name: i for i, lf in enumerate(report.leaves)}
    out.sort(key=lambda f: (f.severity != "error", f.step, order[f.leaf]))
    return tuple(out)


def _nonfinite(leaf: LeafTrend) -> list[Finding]:
    first = next((s for s in leaf.steps if s.nonfinite), None)
    if first is None:
        return []
    return [
        Finding(
            "nonfinite",
            "error",
            leaf.name,
            first.step,
            f"{first.nonfinite} NaN/Inf value(s) at step {first.step}, the first listed step "
            "with any",
        )
    ]


def _zero(leaf: LeafTrend) -> list[Finding]:
    if math.prod(leaf.shape) == 0 or any(s.zeros < 1.0 for s in leaf.steps):
        return []
    span = _span(leaf.steps)
    return [Finding("zero", "warning", leaf.name, leaf.steps[0].step, f"all zeros {span}")]


#: Name components of settings an optimizer keeps constant by design (``optax.inject_hyperparams``
#: stores its learning rate and the like under ``hyperparams``): never ``frozen``.
_SETTINGS = frozenset({"hyperparams", "hyperparams_states"})


def _frozen(leaf: LeafTrend) -> list[Finding]:
    # NaN/Inf is a change of its own (and a finding of its own): such a leaf is not frozen. A
    # scalar (a learning rate, a schedule's constant) or an optimizer's setting is constant
    # by design: only a tensor that the run should have moved is.
    if not leaf.shape or _SETTINGS & set(leaf.name.split(".")):
        return []
    updates = [s.update_norm for s in leaf.steps if s.update_norm is not None]
    if not updates or any(u != 0 for u in updates) or any(s.nonfinite for s in leaf.steps):
        return []
    return [
        Finding(
            "frozen",
            "warning",
            leaf.name,
            leaf.steps[0].step,
            f"never changes {_span(leaf.steps)}, while other leaves do",
        )
    ]


def _dead(leaf: LeafTrend, least: int) -> list[Finding]:
    out = []
    for prev, cur in _pairs(leaf):
        if cur.new_dead_units is None or cur.new_dead_units < least:
            continue
        units = leaf.shape[-1]
        out.append(
            Finding(
                "dead",
                "warning",
                leaf.name,
                cur.step,
                f"{cur.new_dead_units} of {units} units (last axis) all zero at step {cur.step} "
                f"that were not at step {prev.step} ({cur.dead_units} all zero now)",
            )
        )
    return out


def _ratios(leaf: LeafTrend, explode: float, vanish: float) -> list[Finding]:
    pairs = _pairs(leaf)
    ratios = [
        (cur.step, cur.update_ratio)
        for prev, cur in pairs
        if cur.update_ratio is not None
        and cur.update_ratio > 0
        and not prev.nonfinite
        and not cur.nonfinite
    ]
    if len(ratios) < MIN_RATIOS:
        return []
    median = statistics.median(r for _, r in ratios)
    out = []
    for step, r in ratios:
        if r > explode * median:
            out.append(
                Finding(
                    "exploding",
                    "warning",
                    leaf.name,
                    step,
                    f"update ratio {r:.3g} at step {step}, {r / median:.1f}x the leaf's median "
                    f"{median:.3g}",
                )
            )
        elif r * vanish < median:
            out.append(
                Finding(
                    "vanishing",
                    "warning",
                    leaf.name,
                    step,
                    f"update ratio {r:.3g} at step {step}, 1/{median / r:.1f} of the leaf's "
                    f"median {median:.3g}",
                )
            )
    return out


def _jumps(leaf: LeafTrend, factor: float) -> list[Finding]:
    out = []
    for prev, cur in _pairs(leaf):
        if prev.norm is None or cur.norm is None or prev.norm <= 0 or cur.norm <= 0:
            continue  # NaN/Inf (no norm) is a finding of its own
        grow = cur.norm / prev.norm
        if grow > factor or grow * factor < 1:
            out.append(
                Finding(
                    "norm-jump",
                    "warning",
                    leaf.name,
                    cur.step,
                    f"norm {prev.norm:.4g} -> {cur.norm:.4g} from step {prev.step} to "
                    f"{cur.step} (x{grow:.3g})",
                )
            )
    return out


def _pairs(leaf: LeafTrend) -> list[tuple[StepStats, StepStats]]:
    """Consecutive rows compared with each other (the later one has an update)."""
    return [
        (a, b)
        for a, b in zip(leaf.steps, leaf.steps[1:], strict=False)
        if b.update_norm is not None
    ]


def _span(steps: tuple[StepStats, ...]) -> str:
    if len(steps) == 1:
        return f"at step {steps[0].step}"
    return f"over the listed steps {steps[0].step}-{steps[-1].step} ({len(steps)} steps)"
