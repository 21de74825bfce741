"""Text of ``ckpt diff``: both sides, a table of the leaves that differ (all with ``--all``),
and the verdict."""

from __future__ import annotations

from ckpt_cli.commands._text import (
    emit,
    painter,
    plural,
    say,
    shape_str,
    table_lines,
    text_width,
    use_color,
    wrap,
)
from ckpt_cli.core.diff import STATUSES, DiffReport, LeafDiff

_LABEL = {"only_a": "only in A", "only_b": "only in B"}


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def _row(d: LeafDiff) -> list[tuple[str, str]]:
    dtype = d.dtype_a or d.dtype_b or ""
    if d.dtype_a and d.dtype_b and d.dtype_a != d.dtype_b:
        dtype = f"{d.dtype_a} → {d.dtype_b}"
    shape = shape_str(d.shape_a if d.shape_a is not None else d.shape_b)
    if d.shape_a is not None and d.shape_b is not None and d.shape_a != d.shape_b:
        shape = f"{shape_str(d.shape_a)} → {shape_str(d.shape_b)}"
    colour = "green" if d.equal else "red"
    mismatched = f"{d.mismatched}/{d.elements}" if d.elements else ""
    return [
        (d.name, ""),
        (d.status, colour),
        (dtype, ""),
        (shape, ""),
        (_fmt(d.max_abs) if d.elements else "", ""),
        (_fmt(d.max_rel) if d.elements else "", ""),
        (mismatched, ""),
        (d.message or "", ""),
    ]


HEADERS = ["leaf", "status", "dtype", "shape", "max abs", "max rel", "mismatched", "note"]


def print_report(report: DiffReport, show_all: bool) -> None:
    """Both sides, the table of each pair of items (headed by the item's name when two steps
    of several items are compared), the items one side lacks, then the verdict."""
    color = use_color()
    paint = painter(color)
    pairs = report.pairs
    for i, (label, ref) in enumerate((("A", report.a), ("B", report.b))):
        step = f" step {ref.step}" if ref.step is not None else ""
        where = ref.step_location if len(pairs) > 1 and ref.step_location else ref.location
        what = f"items {', '.join(p.a.name for p in pairs)}" if len(pairs) > 1 else "item"
        if report.formats[i] == "safetensors":
            what = "safetensors"
        spec = f", through spec {report.spec}" if i == 0 and report.spec else ""
        say(
            f"{label}: {where}{step} ({what if len(pairs) > 1 else f'{what} {ref.name}'}{spec})",
            color,
        )
    for pair in pairs:
        shown = [d for d in pair.leaves if show_all or not d.equal]
        if len(pairs) > 1:
            verdict = "equal" if all(d.equal for d in pair.leaves) else "different"
            say(f"item {pair.a.name}: {verdict}", color)
        if shown:
            emit(table_lines(HEADERS, [_row(d) for d in shown], paint, wrap_last=True), color)
    for label, names in (("A", report.items_only_a), ("B", report.items_only_b)):
        for name in names:
            say(f"item {name}: only in {label}", color)
    counts = ", ".join(
        f"{report.count(s)} {_LABEL.get(s, s.replace('_', ' '))}"
        for s in STATUSES
        if report.count(s)
    )
    tol = (
        "structure only: no values read"
        if report.structure_only
        else (f"atol={report.atol:g}, rtol={report.rtol:g}")
    )
    word, colour = ("EQUAL", "green") if report.equal else ("DIFFERENT", "red")
    if report.ignored:
        tol += f"; {report.ignored} ignored (--ignore)"
    rest = f" ({tol}): {plural(len(report.all_leaves), 'leaf', 'leaves')}: {counts or 'none'}"
    # Wrapped at spaces like every other line: a narrow terminal must not fold it mid-word.
    first, *more = wrap(word + rest, text_width(), indent="  ")
    emit(
        [paint(word, colour) + paint(first[len(word) :], ""), *(paint(m, "") for m in more)], color
    )
