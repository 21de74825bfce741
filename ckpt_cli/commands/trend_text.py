"""Rendering for ``trend``: findings first, the metrics, then a table per group of leaves
(``--group``: by part of the state, the default, by module or by the first N components of the
name) with sparklines of each leaf's norm and update ratio."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ckpt_cli.commands._text import (
    emit,
    human_count,
    painter,
    plural,
    table,
    text_width,
    wrap,
)
from ckpt_cli.core.scale import Scale
from ckpt_cli.core.trend.types import LeafTrend, TrendReport

BARS = "▁▂▃▄▅▆▇█"
#: Widest sparkline: more steps than this are sampled evenly (first and last kept).
SPARK_WIDTH = 16
_PARTS = (("params", "parameters"), ("opt_state", "optimizer state"))


def scale_line(scale: Scale) -> str:
    """How a run asked to scale out read (a note on stderr)."""
    if not scale.split:
        return f"not split: {scale.reason}"
    return f"{scale.units} units on {scale.workers} {scale.executor} workers"


#: A step whose values (or metric) are NaN/Inf in a sparkline: never a bar, which would read as
#: a value (an all-NaN leaf drawn at the bottom reads as a collapse to zero).
NONFINITE_MARK = "×"


def sparkline(
    values: Sequence[float | None], width: int = SPARK_WIDTH, bad: Sequence[bool] | None = None
) -> str:
    """One character per value scaled between the series' least and greatest (``·`` for a
    missing one, ``×`` where ``bad`` says the step holds NaN/Inf, as a NaN value itself); a
    flat series is a flat line."""
    flags = list(bad) if bad is not None else [False] * len(values)
    if len(values) > width:
        picks = [round(i * (len(values) - 1) / (width - 1)) for i in range(width)]
        values, flags = [values[i] for i in picks], [flags[i] for i in picks]
    known = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
    out = []
    for v, flag in zip(values, flags, strict=True):
        if flag or (v is not None and not math.isfinite(v)):
            out.append(NONFINITE_MARK)
        elif v is None:
            out.append("·")
        elif hi == lo:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int((v - lo) / (hi - lo) * len(BARS)))])
    return "".join(out)


def common_prefix(names: Sequence[str]) -> str:
    """The dotted components every name starts with (ending in a dot), each name keeping at
    least its last component: ``opt_state.0.mu.a``, ``opt_state.0.nu.b`` -> ``opt_state.0.``."""
    if len(names) < 2:
        return ""
    parts = [n.split(".")[:-1] for n in names]
    shared = 0
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        shared += 1
    return "".join(c + "." for c in parts[0][:shared])


def _num(v: float | None, nonfinite: int = 0) -> str:
    """A figure; ``nan`` for one of values holding NaN/Inf (``nonfinite``), ``-`` for none."""
    if nonfinite:
        return "nan"
    return "-" if v is None else f"{v:.4g}"


def divergence_lines(report: TrendReport, width: int | None) -> list[str]:
    """The run's verdict on NaN/Inf: the first step with any, the last without, where it
    started (nothing when every value is finite)."""
    d = report.divergence
    if d is None:
        return []
    shown = ", ".join(d.leaves[:4]) + (
        f", ... ({len(d.leaves)} leaves)" if len(d.leaves) > 4 else ""
    )
    resume = (
        f"last step without: {d.last_finite_step} (resume from it)"
        if d.last_finite_step is not None
        else "no listed step before it is finite"
    )
    return wrap(
        f"diverged: NaN/Inf from step {d.first_step} on (in {shown}); {resume}; steps with "
        f"NaN/Inf: {', '.join(map(str, d.steps))}",
        width,
        indent="  ",
    )


def summary_line(report: TrendReport) -> str:
    steps = report.steps
    span = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    values = sum(math.prod(lf.shape) for lf in report.leaves)
    skipped = (
        f", {plural(report.skipped_reads, 'leaf read')} skipped (recorded digests unchanged)"
        if report.skipped_reads
        else ""
    )
    return (
        f"trend {report.root} (item {report.item}): {plural(len(steps), 'step')} {span}, "
        f"{plural(len(report.leaves), 'leaf', 'leaves')}, {human_count(values)} values{skipped}"
    )


def report_lines(report: TrendReport, width: int | None, group: str = "part") -> list[str]:
    paint = painter(False)
    lines = wrap(summary_line(report), width, indent="  ")
    errors = sum(1 for f in report.findings if f.severity == "error")
    if report.findings:
        lines.append(
            f"findings: {plural(errors, 'error')}, "
            f"{plural(len(report.findings) - errors, 'warning')}"
        )
        for f in report.findings:
            lines += wrap(
                f"{f.severity} {f.kind} {f.leaf} @ {f.step}: {f.message}",
                width,
                first="  ",
                indent="      ",
            )
    else:
        lines.append("findings: none")
    lines += divergence_lines(report, width)
    for name, series in metric_series(report).items():
        known = [v for v in series if v is not None]
        ends = (_metric(known[0]), _metric(known[-1])) if known else ("-", "-")
        lines.append(f"metric {name}: {sparkline(series)} {ends[0]} -> {ends[1]}")
    for title, prefix, leaves in groups(report, group):
        lines.append("")
        under = f", under {prefix}" if prefix and prefix != title + "." else ""
        lines.append(f"{title} ({plural(len(leaves), 'leaf', 'leaves')}{under})")
        rows = []
        for lf in leaves:
            bad = [s.nonfinite > 0 for s in lf.steps]
            last = lf.steps[-1]
            rows.append(
                [
                    (lf.name[len(prefix) :], ""),
                    (sparkline([s.norm for s in lf.steps], bad=bad), ""),
                    (_num(last.norm, last.nonfinite), ""),
                    (sparkline([s.update_ratio for s in lf.steps], bad=bad), ""),
                    (_num(last.update_ratio, last.nonfinite), ""),
                ]
            )
        lines += [
            "  " + line
            for line in table(
                ["leaf", "norm", "last", "update ratio", "last"],
                rows,
                paint,
                width=None if width is None else width - 2,
                right=frozenset({2, 4}),
            )
        ]
    return lines


def print_report(report: TrendReport, group: str = "part") -> None:
    # Plain text even on a terminal: leaf names may hold brackets that Rich reads as markup.
    emit(report_lines(report, text_width(), group), False)


#: How ``--group`` groups leaves: by part of the state, by module (the name without its last
#: component), or by the first N components of the name (``depth:N``; ``depth`` is ``depth:2``).
GROUPINGS = ("part", "module", "depth")
DEFAULT_DEPTH = 2
TOP_LEVEL = "(top level)"


def parse_group(text: str) -> tuple[str, int]:
    """``part``, ``module``, ``depth`` or ``depth:N`` as (grouping, depth); ValueError when
    it is none of them."""
    kind, _, n = text.partition(":")
    if kind not in GROUPINGS or (n and (kind != "depth" or not n.isdigit() or int(n) < 1)):
        raise ValueError(text)
    return kind, int(n) if n else DEFAULT_DEPTH


def groups(report: TrendReport, group: str = "part") -> list[tuple[str, str, list[LeafTrend]]]:
    """The leaves in groups (title, the prefix its rows leave out, leaves): parameters' groups
    first, then the optimizer state's, then the rest, each in the order of its first leaf."""
    kind, depth = parse_group(group)
    rank = {part: i for i, (part, _) in enumerate(_PARTS)}
    titles = dict(_PARTS)
    out: dict[str, list[LeafTrend]] = {}
    for lf in sorted(report.leaves, key=lambda lf: rank.get(lf.part or "", len(rank))):
        if kind == "part":
            key = titles.get(lf.part or "", "other leaves")
        else:
            parts = lf.name.split(".")
            keep = len(parts) - 1 if kind == "module" else min(depth, len(parts) - 1)
            key = ".".join(parts[:keep]) or TOP_LEVEL
        out.setdefault(key, []).append(lf)
    return [(key, _prefix(key, leaves), leaves) for key, leaves in out.items()]


def _prefix(key: str, leaves: list[LeafTrend]) -> str:
    """What a group's rows leave out of their names: the dotted components they share, at
    least the group's own name (module and depth groups)."""
    shared = common_prefix([lf.name for lf in leaves])
    own = key + "." if all(lf.name.startswith(key + ".") for lf in leaves) else ""
    return shared if len(shared) > len(own) else own


def group_series(
    steps: Sequence[int], leaves: Sequence[LeafTrend]
) -> tuple[list[float | None], list[float | None]]:
    """A group's norm (the L2 norm of all its leaves together) and update ratio (the norm of
    all their updates over the norm of all their previous values) at each step."""
    squares: dict[int, float] = {}
    updates: dict[int, float] = {}
    before: dict[int, float] = {}
    bad = group_nonfinite(steps, leaves)
    for lf in leaves:
        for prev, cur in zip((None, *lf.steps), lf.steps, strict=False):
            if cur.norm is not None:
                squares[cur.step] = squares.get(cur.step, 0.0) + cur.norm**2
            if prev is not None and prev.norm is not None and cur.update_norm is not None:
                updates[cur.step] = updates.get(cur.step, 0.0) + cur.update_norm**2
                before[cur.step] = before.get(cur.step, 0.0) + prev.norm**2
    # A step where any leaf of the group holds NaN/Inf has no group figure (not the finite
    # leaves' alone): the charts mark it.
    norms = [
        math.sqrt(squares[s]) if s in squares and not b else None
        for s, b in zip(steps, bad, strict=True)
    ]
    ratios = [
        math.sqrt(updates[s] / before[s]) if before.get(s) and not b else None
        for s, b in zip(steps, bad, strict=True)
    ]
    return norms, ratios


def group_nonfinite(steps: Sequence[int], leaves: Sequence[LeafTrend]) -> list[bool]:
    """Whether any leaf of the group holds NaN/Inf at each step."""
    bad = {s.step for lf in leaves for s in lf.steps if s.nonfinite}
    return [s in bad for s in steps]


def _metric(v: float) -> str:
    return "nan" if math.isnan(v) else _num(v)


def metric_series(report: TrendReport) -> dict[str, list[float | None]]:
    """Each numeric metric over the listed steps (None where a step has none)."""
    by_step = dict(report.metrics)
    names: dict[str, None] = {}
    for _, m in report.metrics:
        for k, v in m.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                names.setdefault(k)
    out: dict[str, list[float | None]] = {}
    for name in names:
        series: list[float | None] = []
        for step in report.steps:
            v = by_step.get(step, {}).get(name)
            # NaN/Inf stays itself: the series marks it, never takes it for a missing value.
            series.append(float(v) if isinstance(v, int | float) else None)
        out[name] = series
    return out
