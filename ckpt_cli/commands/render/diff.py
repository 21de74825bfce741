"""Text of ``ckpt diff``: both sides, a table of the leaves that differ (all with ``--all``),
and the verdict."""

from __future__ import annotations

from rich.table import Table

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.units import shape_str
from ckpt_cli.core.diff import STATUSES, DiffReport, LeafDiff

_LABEL = {"only_a": "only in A", "only_b": "only in B"}


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def _row(d: LeafDiff) -> list[str]:
    dtype = d.dtype_a or d.dtype_b or ""
    if d.dtype_a and d.dtype_b and d.dtype_a != d.dtype_b:
        dtype = f"{d.dtype_a} → {d.dtype_b}"
    shape = shape_str(d.shape_a if d.shape_a is not None else d.shape_b)
    if d.shape_a is not None and d.shape_b is not None and d.shape_a != d.shape_b:
        shape = f"{shape_str(d.shape_a)} → {shape_str(d.shape_b)}"
    colour = "green" if d.equal else "red"
    mismatched = f"{d.mismatched}/{d.elements}" if d.elements else ""
    return [
        d.name,
        f"[{colour}]{d.status}[/]",
        dtype,
        shape,
        _fmt(d.max_abs) if d.elements else "",
        _fmt(d.max_rel) if d.elements else "",
        mismatched,
        d.message or "",
    ]


def print_report(report: DiffReport, show_all: bool) -> None:
    console = stdout_console()
    for label, ref in (("A", report.a), ("B", report.b)):
        step = f" step {ref.step}" if ref.step is not None else ""
        console.print(f"{label}: {ref.location}{step} (item {ref.name})")
    shown = [d for d in report.leaves if show_all or not d.equal]
    if shown:
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        for col in ("leaf", "status", "dtype", "shape", "max abs", "max rel", "mismatched", "note"):
            table.add_column(col, overflow="fold")
        for d in shown:
            table.add_row(*_row(d))
        console.print(table)
    counts = ", ".join(
        f"{report.count(s)} {_LABEL.get(s, s.replace('_', ' '))}"
        for s in STATUSES
        if report.count(s)
    )
    tol = f"atol={report.atol:g}, rtol={report.rtol:g}"
    verdict = "[green]EQUAL[/]" if report.equal else "[red]DIFFERENT[/]"
    console.print(f"{verdict} ({tol}): {len(report.leaves)} leaves: {counts or 'none'}")
