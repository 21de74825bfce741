"""Text renderer of ``ckpt import``: one line per leaf, then a summary."""

from __future__ import annotations

from typing import Any

from ckpt_cli.commands._text import human_bytes, print_table, say, shape_str, use_color
from ckpt_cli.commands.export_text import ops


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
                ops(leaf.steps) or "unchanged",
            ]
        )
    headers = ("leaf", "array", "chunk", "sharding", "from", "operations")
    print_table(headers, rows, frozenset({"sharding", "from"}))
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
