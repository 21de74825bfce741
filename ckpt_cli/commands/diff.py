"""``ckpt diff``: compare two checkpoints leaf by leaf, values streamed chunk by chunk."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckpt_cli.commands._common import (
    FilterOpt,
    ItemOpt,
    JsonOpt,
    emit_json,
    shape_str,
    stdout_console,
)
from ckpt_cli.commands._progress import progress_bar
from ckpt_cli.errors import EXIT_PROBLEMS, UsageError

if TYPE_CHECKING:  # the core is imported when the command runs, not when `ckpt` starts
    from ckpt_cli.core.diff import DiffReport, LeafDiff
    from ckpt_cli.core.format.layout import ItemRef


def diff(
    a: Annotated[str, typer.Argument(help="Root, step or item; ROOT@STEP picks a step.")],
    b: Annotated[str, typer.Argument(help="Root, step or item; ROOT@STEP picks a step.")],
    step: Annotated[
        int | None,
        typer.Option("--step", "-s", help="Step to take from both roots.", show_default=False),
    ] = None,
    step_a: Annotated[
        int | None, typer.Option("--step-a", help="Step of A's root.", show_default=False)
    ] = None,
    step_b: Annotated[
        int | None, typer.Option("--step-b", help="Step of B's root.", show_default=False)
    ] = None,
    item: ItemOpt = None,
    atol: Annotated[
        float, typer.Option("--atol", help="Absolute tolerance: |a-b| <= atol + rtol*|b|.")
    ] = 0.0,
    rtol: Annotated[float, typer.Option("--rtol", help="Relative tolerance.")] = 0.0,
    compare_cast: Annotated[
        bool,
        typer.Option(
            "--compare-cast",
            help="Compare leaves whose dtype changed as float64 instead of counting them as "
            "different.",
        ),
    ] = False,
    filter_: FilterOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="List equal leaves too, not only the differences.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Compare two checkpoints (any layouts, steps or items) leaf by leaf.

    Reports leaves only in A or only in B, changed dtype or shape, and for the others whether
    the values are equal within --atol/--rtol, with the max absolute and relative difference.
    Reads both sides chunk by chunk; memory does not grow with the checkpoint. NaN equals NaN.

    Exit codes: 0 equal within tolerance · 1 different · 2 usage · 3 not a checkpoint.
    """
    if atol < 0 or rtol < 0:
        raise UsageError("--atol and --rtol must not be negative")
    ref_a = _resolve(a, step_a if step_a is not None else step, item, "--step-a")
    ref_b = _resolve(b, step_b if step_b is not None else step, item, "--step-b")
    from ckpt_cli.core.diff import diff_items

    with progress_bar(not json_out) as on_progress:
        report = diff_items(ref_a, ref_b, atol, rtol, compare_cast, filter_, on_progress)
    if json_out:
        emit_json(_json(report))
    else:
        _print(report, show_all)
    if not report.equal:
        raise typer.Exit(EXIT_PROBLEMS)


def _resolve(target: str, step: int | None, item: str | None, flag: str) -> ItemRef:
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.storage import open_location

    path, at, tail = target.rpartition("@")
    if at and tail.isdigit() and not os.path.exists(target):
        if step is not None:
            raise UsageError(f"{target} names a step; do not also pass {flag} or --step")
        return resolve_item(open_location(path), int(tail), item)
    return resolve_item(open_location(target), step, item)


def _side(ref: ItemRef) -> dict[str, Any]:
    return {"path": str(ref.location), "step": ref.step, "item": ref.name}


def _json(report: DiffReport) -> dict[str, Any]:
    from ckpt_cli.core.diff import STATUSES

    return {
        "a": _side(report.a),
        "b": _side(report.b),
        "equal": report.equal,
        "tolerance": {"atol": report.atol, "rtol": report.rtol},
        "compare_cast": report.compare_cast,
        "summary": {s: report.count(s) for s in STATUSES},
        "leaves": [d.to_json() for d in report.leaves],
    }


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


def _print(report: DiffReport, show_all: bool) -> None:
    from rich.table import Table  # here, so that `ckpt --help` does not import it

    from ckpt_cli.core.diff import STATUSES

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
