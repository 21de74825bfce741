"""Text of ``ckpt reshard``: the plan per leaf (old and new chunks, partition spec, bytes)."""

from __future__ import annotations

from ckpt_cli.commands._text import (
    emit,
    human_bytes,
    painter,
    say,
    shape_str,
    table_lines,
    use_color,
)
from ckpt_cli.core.reshard.plan import LeafPlan, ReshardPlan


def print_plan(plan: ReshardPlan) -> None:
    """One table per item (headed by its name when the step's items are resharded together),
    then the target mesh and the bytes to write."""
    color = use_color()
    items = plan.items
    for item in items:
        if len(items) > 1:
            say(f"item {item.source.name}:", color)
        _print_leaves(item.layout.leaves, color)
    mesh = plan.layout.mesh
    if mesh:
        axes = ",".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.shape, strict=True))
        several = f" in {len(items)} items" if len(items) > 1 else ""
        say(
            f"target mesh {axes} ({mesh.size} devices); "
            f"{human_bytes(plan.total_bytes)} to write{several}",
            color,
        )


def _print_leaves(leaves: tuple[LeafPlan, ...], color: bool) -> None:
    paint = painter(color)
    with_problems = any(p.problem for p in leaves)
    rows = []
    for p in leaves:
        if not p.leaf.is_array:
            continue
        row = [
            (p.leaf.name, ""),
            (f"{p.leaf.dtype}{shape_str(p.leaf.shape)}", "cyan"),
            (shape_str(p.leaf.chunk_shape), ""),
            (shape_str(p.chunk_shape), "green"),
            (
                (p.sharding.short() if p.sharding else "host value")
                + (f" (follows {p.follows})" if p.follows else ""),
                "blue",
            ),
            (human_bytes(p.leaf.size_bytes), ""),
        ]
        if with_problems:
            row.append((p.problem or "", "red"))
        rows.append(row)
    headers = ["leaf", "array", "old chunk", "new chunk", "spec", "bytes"]
    headers += ["problem"] * with_problems
    emit(table_lines(headers, rows, paint, right=frozenset({5}), wrap_last=with_problems), color)
