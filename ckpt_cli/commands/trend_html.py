"""``ckpt trend --html FILE``: one self-contained page (inline SVG and CSS, no script, no
network resource): the findings linked to their leaves, each metric's curve, per group of
leaves (``--group``: part of the state, module, depth) the group's norm and update ratio and a
table with each leaf's curves, and a heat map of update ratios (leaf x step, in group order; a
cell's exact figures are in its tooltip)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a command module imports the core and renderers when it runs
    from ckpt_cli.core.trend.types import LeafTrend, TrendReport

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;vertical-align:middle}
tr:target{background:#fff3b0}.error{color:#b00020}.warning{color:#8a5a00}
code{font-size:.95em}.num{text-align:right;font-variant-numeric:tabular-nums}
svg{display:block}.axis{fill:#666;font-size:10px}
.group{display:flex;gap:1em}figure{margin:0}figcaption{color:#666;font-size:12px}
"""


def page(report: TrendReport, group: str = "part") -> str:
    """The whole page; ``group`` as ``--group`` groups the leaves."""
    from ckpt_cli.commands.trend_text import (
        divergence_lines,
        groups,
        metric_series,
        summary_line,
    )

    ids = leaf_ids(report.leaves)
    verdict = [" ".join(line.strip() for line in divergence_lines(report, None))]
    verdict = [v for v in verdict if v]
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ckpt trend: {escape(report.root)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>ckpt trend</h1><p>{escape(summary_line(report))}</p>",
        *[f'<p class="error" id="divergence">{escape(line)}</p>' for line in verdict],
        "<h2>Findings</h2>",
    ]
    if report.findings:
        out.append('<ul id="findings">')
        for f in report.findings:
            out.append(
                f'<li class="{f.severity}">{f.severity} <b>{escape(f.kind)}</b> '
                f'<a href="#{ids[f.leaf]}"><code>{escape(f.leaf)}</code></a> @ {f.step}: '
                f"{escape(f.message)}</li>"
            )
        out.append("</ul>")
    else:
        out.append('<p id="findings">none</p>')
    series = metric_series(report)
    if series:
        out.append("<h2>Metrics</h2>")
        for name, values in series.items():
            out.append(f"<h3>{escape(name)}</h3>")
            out.append(_chart(list(report.steps), values, 600, 160, f"metric {name}"))
    grouped = groups(report, group)
    for title, prefix, leaves in grouped:
        heading = title[:1].upper() + title[1:] if group == "part" else title
        out += _group(report, heading, prefix, leaves, ids)
    out.append("<h2>Update ratio, leaf x step</h2>")
    out.append(_heatmap(report, [lf for _, _, leaves in grouped for lf in leaves], ids))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _group(
    report: TrendReport, title: str, prefix: str, leaves: list[LeafTrend], ids: dict[str, str]
) -> list[str]:
    """A group's heading, its norm and update ratio over the steps (all its leaves as one),
    and a row per leaf (its name without ``prefix``)."""
    from ckpt_cli.commands.trend_text import group_nonfinite, group_series

    under = f", under <code>{escape(prefix)}</code>" if prefix else ""
    n = f"{len(leaves)} leaf" if len(leaves) == 1 else f"{len(leaves)} leaves"
    norms, ratios = group_series(report.steps, leaves)
    bad = group_nonfinite(report.steps, leaves)
    steps = list(report.steps)
    out = [
        f"<h2>{escape(title)}</h2><p>{n}{under}</p>",
        '<div class="group">'
        f"<figure>{_chart(steps, norms, 360, 120, f'{title} norm', bad)}"
        "<figcaption>norm of the group</figcaption></figure>"
        f"<figure>{_chart(steps, ratios, 360, 120, f'{title} update ratio', bad)}"
        "<figcaption>update ratio of the group</figcaption></figure></div>",
        "<table><tr><th>leaf</th><th>dtype</th><th>shape</th><th>norm</th>"
        '<th class="num">last</th><th>update ratio</th><th class="num">last</th></tr>',
    ]
    for lf in leaves:
        row = [s.step for s in lf.steps]
        flags = [s.nonfinite > 0 for s in lf.steps]
        last = lf.steps[-1]
        out.append(
            f'<tr id="{ids[lf.name]}"><td><code title="{escape(lf.name)}">'
            f"{escape(lf.name[len(prefix) :])}</code></td>"
            f"<td>{escape(lf.dtype)}</td><td>{escape(str(list(lf.shape)))}</td>"
            f"<td>{_chart(row, [s.norm for s in lf.steps], 160, 36, 'norm', flags)}</td>"
            f'<td class="num">{_num(last.norm, last.nonfinite)}</td>'
            f"<td>{_chart(row, [s.update_ratio for s in lf.steps], 160, 36, 'ratio', flags)}</td>"
            f'<td class="num">{_num(last.update_ratio, last.nonfinite)}</td></tr>'
        )
    out.append("</table>")
    return out


def write_html(report: TrendReport, path: str, group: str = "part") -> None:
    """The page at ``path``, written to a temporary name and renamed."""
    from ckpt_cli.core.storage.local import LocalLocation

    data = page(report, group).encode()
    LocalLocation(str(Path(path))).write_bytes(data, create_parents=False)


def _num(v: float | None, nonfinite: int = 0) -> str:
    if nonfinite:
        return "nan"
    return "-" if v is None else f"{v:.4g}"


def _chart(
    steps: Sequence[int],
    values: Sequence[float | None],
    width: int,
    height: int,
    label: str,
    bad: Sequence[bool] | None = None,
) -> str:
    """A line over the steps (gaps where a value is missing or not finite), scaled to the
    series' own range; a step whose values are NaN/Inf (``bad``, or a NaN value itself) gets a
    red ``nonfinite`` mark across the chart, never a point on the zero line; small charts have
    no axis labels."""
    marks, pts = _split_nonfinite(steps, values, bad)
    big = height > 60
    pad = 28 if big else 2
    svg = [
        f'<svg role="img" aria-label="{escape(label)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    s0, s1 = (min(steps), max(steps)) if steps else (0, 0)

    def x_of(s: int) -> float:
        return pad + (width - 2 * pad) * ((s - s0) / (s1 - s0) if s1 > s0 else 0.5)

    for s in marks:
        svg.append(
            f'<line class="nonfinite" x1="{x_of(s):.1f}" y1="{pad}" x2="{x_of(s):.1f}" '
            f'y2="{height - pad}" stroke="#ff1744" stroke-width="2" stroke-dasharray="3,2">'
            f"<title>step {s}: NaN/Inf</title></line>"
        )
    if pts:
        lo, hi = min(v for _, v in pts), max(v for _, v in pts)

        def xy(s: int, v: float) -> str:
            y = height - pad - (height - 2 * pad) * ((v - lo) / (hi - lo) if hi > lo else 0.5)
            return f"{x_of(s):.1f},{y:.1f}"

        line = " ".join(xy(s, v) for s, v in pts)
        svg.append(f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{line}"/>')
        for s, v in pts:
            x, y = xy(s, v).split(",")
            svg.append(
                f'<circle cx="{x}" cy="{y}" r="{2.5 if big else 1.5}" fill="#1565c0">'
                f"<title>step {s}: {v:.6g}</title></circle>"
            )
        if big:
            svg.append(f'<text class="axis" x="2" y="12">{hi:.4g}</text>')
            svg.append(f'<text class="axis" x="2" y="{height - 4}">{lo:.4g}</text>')
            svg.append(f'<text class="axis" x="{pad}" y="{height - 4}" dx="40">step {s0}</text>')
            svg.append(
                f'<text class="axis" x="{width - pad}" y="{height - 4}" text-anchor="end">'
                f"step {s1}</text>"
            )
    svg.append("</svg>")
    return "".join(svg)


def _split_nonfinite(
    steps: Sequence[int], values: Sequence[float | None], bad: Sequence[bool] | None
) -> tuple[list[int], list[tuple[int, float]]]:
    """The steps to mark as NaN/Inf (``bad``, or a value that is NaN/Inf itself), and the
    points to draw (every finite value at another step)."""
    flags = list(bad) if bad is not None else [False] * len(values)
    marks = [
        s
        for s, v, b in zip(steps, values, flags, strict=True)
        if b or (v is not None and not math.isfinite(v))
    ]
    pts = [
        (s, v)
        for s, v in zip(steps, values, strict=True)
        if v is not None and math.isfinite(v) and s not in marks
    ]
    return marks, pts


def _color(ratio: float | None, lo: float, hi: float, nonfinite: bool) -> str:
    if nonfinite:
        return "#d50000"
    if ratio is None:
        return "#eeeeee"
    if ratio == 0:
        return "#ffffff"
    t = (math.log10(ratio) - lo) / (hi - lo) if hi > lo else 0.5
    t = min(1.0, max(0.0, t))
    return f"rgb({int(255 * t)},{int(80 + 100 * (1 - t))},{int(255 * (1 - t))})"


def _heatmap(report: TrendReport, leaves: Sequence[LeafTrend], ids: dict[str, str]) -> str:
    """A cell per leaf (in ``leaves``' order) and step, coloured by the update ratio."""
    logs = [
        math.log10(s.update_ratio)
        for lf in report.leaves
        for s in lf.steps
        if s.update_ratio is not None and s.update_ratio > 0
    ]
    lo, hi = (min(logs), max(logs)) if logs else (0.0, 0.0)
    cell, label = 22, 12 + 6 * max(len(lf.name) for lf in leaves)
    width = label + cell * len(report.steps) + 4
    height = 20 + cell * len(leaves)
    col = {step: i for i, step in enumerate(report.steps)}
    svg = [
        f'<svg role="img" aria-label="update ratio heat map" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for step, i in col.items():
        svg.append(f'<text class="axis" x="{label + i * cell + 2}" y="12">{step}</text>')
    for r, lf in enumerate(leaves):
        y = 16 + r * cell
        svg.append(
            f'<a href="#{ids[lf.name]}"><text class="axis" x="0" y="{y + 14}">'
            f"{escape(lf.name)}</text></a>"
        )
        for s in lf.steps:
            fill = _color(s.update_ratio, lo, hi, s.nonfinite > 0)
            tip = (
                f"{lf.name} @ {s.step}: update ratio {_num(s.update_ratio, s.nonfinite)}, "
                f"norm {_num(s.norm, s.nonfinite)}"
            )
            if s.nonfinite:
                tip += f", {s.nonfinite} NaN/Inf"
            # An update of exactly 0 is a white cell: outlined, or it would not show.
            edge = ' stroke="#9e9e9e"' if s.update_ratio == 0 else ""
            svg.append(
                f'<rect x="{label + col[s.step] * cell}" y="{y}" width="{cell - 2}" '
                f'height="{cell - 2}" fill="{fill}"{edge}><title>{escape(tip)}</title></rect>'
            )
    svg.append("</svg>")
    return "".join(svg)


def leaf_ids(leaves: Sequence[LeafTrend]) -> dict[str, str]:
    """The anchor of each leaf's row (findings and heat map link to it)."""
    return {lf.name: f"leaf-{i}" for i, lf in enumerate(leaves)}
