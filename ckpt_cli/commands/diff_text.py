"""Text of ``ckpt diff``: both sides, a table of the leaves that differ or hold NaN or Inf (all
with ``--all``), and the verdict, which says how many equal leaves the table leaves out."""

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


_NONFINITE = {"nan": "NaN", "inf": "Inf"}


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    text = f"{x:.3g}"
    return _NONFINITE.get(text, text)


def _shown(d: LeafDiff, show_all: bool) -> bool:
    """A row of the table: a leaf not equal, or one holding NaN or Inf (equal NaN at the same
    places is still NaN: a diverged step must not read as a clean one), or every leaf."""
    return show_all or not d.equal or d.has_nonfinite


def _row(d: LeafDiff) -> list[tuple[str, str]]:
    dtype = d.dtype_a or d.dtype_b or ""
    if d.dtype_a and d.dtype_b and d.dtype_a != d.dtype_b:
        dtype = f"{d.dtype_a} → {d.dtype_b}"
    shape = shape_str(d.shape_a if d.shape_a is not None else d.shape_b)
    if d.shape_a is not None and d.shape_b is not None and d.shape_a != d.shape_b:
        shape = f"{shape_str(d.shape_a)} → {shape_str(d.shape_b)}"
    colour = ("yellow" if d.has_nonfinite else "green") if d.equal else "red"
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
        shown = [d for d in pair.leaves if _shown(d, show_all)]
        if len(pairs) > 1:
            verdict = "equal" if all(d.equal for d in pair.leaves) else "different"
            held = sum(1 for d in pair.leaves if d.has_nonfinite)
            if held:
                verdict += f" ({_which(pair.leaves)} in {plural(held, 'leaf', 'leaves')})"
            say(f"item {pair.a.name}: {verdict}", color)
        if shown:
            emit(table_lines(HEADERS, [_row(d) for d in shown], paint, wrap_last=True), color)
    for label, names in (("A", report.items_only_a), ("B", report.items_only_b)):
        for name in names:
            say(f"item {name}: only in {label}", color)
    _verdict(report, show_all, color)


def _which(leaves: tuple[LeafDiff, ...]) -> str:
    """``NaN``, ``Inf`` or ``NaN or Inf``: what the leaves' non-finite values are."""
    counts = [d.nonfinite for d in leaves if d.nonfinite]
    nan = any(c.nan_a or c.nan_b for c in counts)
    inf = any(c.inf_a or c.inf_b for c in counts)
    return "NaN or Inf" if nan and inf else "Inf" if inf else "NaN"


def _verdict(report: DiffReport, show_all: bool, color: bool) -> None:
    """``EQUAL``/``DIFFERENT``, the tolerance, the leaves by status, the leaves holding NaN or
    Inf on each side, and the equal leaves the table leaves out (the counts add up to the
    rows shown)."""
    paint = painter(color)
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
    leaves = report.all_leaves
    sides = [sum(1 for d in leaves if d.nonfinite and d.nonfinite.side(i)) for i in (0, 1)]
    if any(sides):
        rest += f"; {_which(leaves)} in {sides[0]} of A's leaves, {sides[1]} of B's"
    hidden = sum(1 for d in leaves if not _shown(d, show_all))
    if hidden and hidden < len(leaves):  # a table was printed: say what it leaves out
        rest += f"; {plural(hidden, 'equal leaf', 'equal leaves')} not shown (--all)"
    # Wrapped at spaces like every other line: a narrow terminal must not fold it mid-word.
    first, *more = wrap(word + rest, text_width(), indent="  ")
    emit(
        [paint(word, colour) + paint(first[len(word) :], ""), *(paint(m, "") for m in more)], color
    )
