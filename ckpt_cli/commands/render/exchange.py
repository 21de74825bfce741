"""Text renderers of ``ckpt export`` and ``ckpt import``: one line per tensor, then a summary."""

from __future__ import annotations

from typing import Any

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.units import shape_str
from ckpt_cli.core.units import human_bytes


def _ops(steps: Any) -> str:
    return ", ".join(f"{s.op} {s.detail}" if s.op != "rename" else "rename" for s in steps)


def print_export_plan(plan: Any) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for column in ("tensor", "array", "file", "from", "operations"):
        table.add_column(column, no_wrap=column in ("tensor", "array"))
    many = len(plan.files.files) > 1
    for t in plan.tensors:
        sources = ", ".join(t.sources)
        table.add_row(
            t.name,
            f"{t.dtype}{shape_str(t.shape)}",
            t.file if many else "",
            "" if sources == t.name else sources,
            _ops(t.steps) or "unchanged",
        )
    console = stdout_console()
    console.print(table)
    files = len(plan.files.files)
    n = len(plan.skipped)
    skipped = f"; {n} lea{'ves' if n > 1 else 'f'} not exported" if n else ""
    index = f" + {plan.files.index_name}" if plan.files.index_name else ""
    console.print(
        f"{len(plan.tensors)} tensors, {human_bytes(plan.total_bytes)} in {files} "
        f"file{'s' if files > 1 else ''}{index}{skipped}"
    )
    reasons: dict[str, int] = {}
    for s in plan.skipped:
        reasons[s.reason] = reasons.get(s.reason, 0) + 1
    for reason, n in sorted(reasons.items()):
        console.print(f"  not exported: {n} x {reason}")


def print_import_plan(plan: Any) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for column in ("leaf", "array", "chunk", "sharding", "from", "operations"):
        table.add_column(column, no_wrap=column in ("leaf", "array"))
    for leaf in plan.leaves:
        s = leaf.sharding
        sharding = (
            f"{s.mesh_str()} {list(leaf.partition or ())}" if s.mesh_shape else s.device_str or ""
        )
        sources = ", ".join(leaf.sources)
        table.add_row(
            leaf.name,
            f"{leaf.expr.dtype}{shape_str(leaf.expr.shape)}",
            shape_str(leaf.chunk_shape),
            sharding,
            "" if sources == leaf.name else sources,
            _ops(leaf.steps) or "unchanged",
        )
    console = stdout_console()
    console.print(table)
    n = len(plan.dropped)
    dropped = f"; {n} tensor{'s' if n > 1 else ''} dropped" if n else ""
    console.print(
        f"{len(plan.leaves)} leaves, {human_bytes(plan.total_bytes)} from "
        f"{len(plan.files)} file{'s' if len(plan.files) > 1 else ''}{dropped}; "
        f"into item {plan.item!r} of step {plan.step}"
    )
    console.print(_containers(plan))


def _containers(plan: Any) -> str:
    """Where the tree's containers come from, and its empty nodes."""
    if plan.containers == "names":
        return "containers: dicts, from the tensor names (--target gives tuples and optax states)"
    where = "--target" if plan.containers == "target" else "the files' ckpt.tree"
    n = len(plan.empties)
    if not n:
        return f"containers: from {where}"
    names = ", ".join(e.name for e in plan.empties[:3]) + (", ..." if n > 3 else "")
    return f"containers: from {where}, {n} empty node{'s' if n != 1 else ''} ({names})"


def print_written(path: str, nbytes: int, seconds: float) -> None:
    rate = nbytes / seconds if seconds > 0 else 0
    stdout_console().print(
        f"wrote {path}: {human_bytes(nbytes)} in {seconds:.1f} s ({human_bytes(int(rate))}/s)"
    )
