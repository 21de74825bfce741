"""Text renderers of ``ckpt export`` and ``ckpt import``: one line per tensor, then a summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_cli.commands.render.lines import emit, painter, say, table_lines, use_color
from ckpt_cli.commands.render.units import shape_str
from ckpt_cli.core.units import human_bytes


def _ops(steps: Any) -> str:
    return ", ".join(f"{s.op} {s.detail}" if s.op != "rename" else "rename" for s in steps)


def _table(headers: Sequence[str], rows: list[list[str]], optional: frozenset[str]) -> None:
    """The rows as aligned columns; an ``optional`` column empty in every row is left out
    (``file`` of a single-file export, ``from`` when no tensor was renamed)."""
    keep = [
        i
        for i, header in enumerate(headers)
        if header not in optional or any(row[i] for row in rows)
    ]
    color = use_color()
    paint = painter(color)
    cells = [[(row[i], "") for i in keep] for row in rows]
    emit(table_lines([headers[i] for i in keep], cells, paint, wrap_last=True), color)


def print_export_plan(plan: Any) -> None:
    many = len(plan.files.files) > 1
    rows = []
    for t in plan.tensors:
        sources = ", ".join(t.sources)
        rows.append(
            [
                t.name,
                f"{t.dtype}{shape_str(t.shape)}",
                t.file if many else "",
                "" if sources == t.name else sources,
                _ops(t.steps) or "unchanged",
            ]
        )
    _table(("tensor", "array", "file", "from", "operations"), rows, frozenset({"file", "from"}))
    color = use_color()
    files = len(plan.files.files)
    n = len(plan.skipped)
    skipped = f"; {n} lea{'ves' if n > 1 else 'f'} not exported" if n else ""
    index = f" + {plan.files.index_name}" if plan.files.index_name else ""
    say(
        f"{len(plan.tensors)} tensors, {human_bytes(plan.total_bytes)} in {files} "
        f"file{'s' if files > 1 else ''}{index}{skipped}",
        color,
    )
    reasons: dict[str, int] = {}
    for s in plan.skipped:
        reasons[s.reason] = reasons.get(s.reason, 0) + 1
    for reason, n in sorted(reasons.items()):
        say(f"not exported: {n} x {reason}", color, indent="  ")


def print_import_plan(plan: Any) -> None:
    rows = []
    for leaf in plan.leaves:
        s = leaf.sharding
        sharding = (
            f"{s.mesh_str()} {list(leaf.partition or ())}" if s.mesh_shape else s.device_str or ""
        )
        sources = ", ".join(leaf.sources)
        rows.append(
            [
                leaf.name,
                f"{leaf.expr.dtype}{shape_str(leaf.expr.shape)}",
                shape_str(leaf.chunk_shape),
                sharding,
                "" if sources == leaf.name else sources,
                _ops(leaf.steps) or "unchanged",
            ]
        )
    headers = ("leaf", "array", "chunk", "sharding", "from", "operations")
    _table(headers, rows, frozenset({"sharding", "from"}))
    color = use_color()
    n = len(plan.dropped)
    dropped = f"; {n} tensor{'s' if n > 1 else ''} dropped" if n else ""
    say(
        f"{len(plan.leaves)} leaves, {human_bytes(plan.total_bytes)} from "
        f"{len(plan.files)} file{'s' if len(plan.files) > 1 else ''}{dropped}; "
        f"into item {plan.item!r} of step {plan.step}",
        color,
    )
    say(_containers(plan), color)


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


def print_written(path: str, nbytes: int, seconds: float, files: Sequence[str] = ()) -> None:
    """``wrote PATH/FILE`` (one file), ``wrote N files to PATH (first, ..., last)``, or ``wrote PATH``
    (a step), then the bytes, the time and the rate."""
    rate = nbytes / seconds if seconds > 0 else 0
    if len(files) == 1:
        what = f"{path.rstrip('/')}/{files[0]}"
    elif files:
        shown = ", ".join(files) if len(files) <= 3 else f"{files[0]}, ..., {files[-1]}"
        what = f"{len(files)} files to {path} ({shown})"
    else:
        what = path
    say(
        f"wrote {what}: {human_bytes(nbytes)} in {seconds:.1f} s ({human_bytes(int(rate))}/s)",
        use_color(),
    )
