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


def sparkline(values: Sequence[float | None], width: int = SPARK_WIDTH) -> str:
    """One character per value scaled between the series' least and greatest (``·`` for a
    missing one); a flat series is a flat line."""
    if len(values) > width:
        picks = [round(i * (len(values) - 1) / (width - 1)) for i in range(width)]
        values = [values[i] for i in picks]
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return "·" * len(values)
    lo, hi = min(known), max(known)
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
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


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


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
    for name, series in metric_series(report).items():
        finite = [v for v in series if v is not None]
        lines.append(f"metric {name}: {sparkline(series)} {_num(finite[0])} -> {_num(finite[-1])}")
    for title, prefix, leaves in groups(report, group):
        lines.append("")
        under = f", under {prefix}" if prefix and prefix != title + "." else ""
        lines.append(f"{title} ({plural(len(leaves), 'leaf', 'leaves')}{under})")
        rows = []
        for lf in leaves:
            norms = [s.norm for s in lf.steps]
            ratios = [s.update_ratio for s in lf.steps]
            last = lf.steps[-1]
            rows.append(
                [
                    (lf.name[len(prefix) :], ""),
                    (sparkline(norms), ""),
                    (_num(last.norm), ""),
                    (sparkline(ratios), ""),
                    (_num(last.update_ratio), ""),
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
    for lf in leaves:
        for prev, cur in zip((None, *lf.steps), lf.steps, strict=False):
            squares[cur.step] = squares.get(cur.step, 0.0) + cur.norm**2
            if prev is not None and cur.update_norm is not None:
                updates[cur.step] = updates.get(cur.step, 0.0) + cur.update_norm**2
                before[cur.step] = before.get(cur.step, 0.0) + prev.norm**2
    norms = [math.sqrt(squares[s]) if s in squares else None for s in steps]
    ratios = [math.sqrt(updates[s] / before[s]) if before.get(s) else None for s in steps]
    return norms, ratios


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
            series.append(float(v) if isinstance(v, int | float) else None)
        out[name] = series
    return out
