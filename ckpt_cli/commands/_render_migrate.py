"""Rendering of a migration plan: a table per destination leaf, or one JSON document."""

from __future__ import annotations

from typing import Any

from ckpt_cli.commands._common import human_bytes, shape_str, stdout_console
from ckpt_cli.core.format.layout import ItemRef
from ckpt_cli.core.migrate.plan import DestLeaf, MigrationPlan


def _leaf_json(leaf: DestLeaf) -> dict[str, Any]:
    expr, layout = leaf.expr, leaf.layout
    sharding = layout.sharding if layout is not None else None
    return {
        "name": leaf.name,
        "value_type": leaf.value_type,
        "dtype": expr.dtype if expr is not None else None,
        "shape": list(expr.shape) if expr is not None else None,
        "sources": list(leaf.sources),
        "changed": leaf.changed,
        "operations": [s.to_json() for s in leaf.steps],
        "streams": expr.streams if expr is not None else True,
        "chunk_shape": list(layout.chunk_shape) if layout is not None else None,
        "sharding": sharding.to_json() if sharding is not None else None,
        "size_bytes": leaf.size_bytes,
        "note": layout.note if layout is not None else None,
    }


def plan_json(plan: MigrationPlan, ref: ItemRef, target: str | None, diffs: Any) -> dict[str, Any]:
    return {
        "spec": {
            "path": plan.spec.path,
            "sha256": plan.spec.sha256,
            "rules": len(plan.spec.rules),
        },
        "source": {"path": str(ref.location), "step": ref.step, "item": ref.name},
        "total_bytes": plan.total_bytes,
        "leaves": [_leaf_json(leaf) for leaf in plan.leaves],
        "dropped": list(plan.dropped),
        "unused_rules": list(plan.unused_rules),
        "target": None
        if target is None
        else {"function": target, "differences": [d.to_json() for d in diffs or ()]},
    }


def print_plan(plan: MigrationPlan, target: str | None, diffs: Any) -> None:
    from ckpt_cli.commands._lines import emit, painter, table_lines, use_color

    color = use_color()
    paint = painter(color)
    rows = []
    for leaf in plan.leaves:
        expr = leaf.expr
        array = f"{expr.dtype}{shape_str(expr.shape)}" if expr is not None else leaf.value_type
        sources = ", ".join(s for s in leaf.sources if s != leaf.name)
        ops = "; ".join(s.text() for s in leaf.steps) if leaf.changed else "unchanged"
        if expr is not None and not expr.streams:
            ops += "  (holds the whole leaf)"
        if leaf.layout is not None and leaf.layout.note:
            ops += f"  ({leaf.layout.note})"
        rows.append(
            [
                (leaf.name, "" if leaf.changed else "dim"),
                (array, "cyan"),
                (sources or ("new" if not leaf.sources else ""), "blue"),
                (ops, "green" if leaf.changed else "dim"),
            ]
        )
    emit(table_lines(["leaf", "array", "from", "operations"], rows, paint), color)
    out = stdout_console()
    changed = len(plan.changed)
    out.print(
        f"{len(plan.leaves)} leaves: {changed} changed, {len(plan.leaves) - changed} unchanged; "
        f"{len(plan.dropped)} dropped; {human_bytes(plan.total_bytes)} to write"
    )
    if plan.dropped:
        out.print("dropped: " + ", ".join(plan.dropped))
    for label in plan.unused_rules:
        out.print(f"unused: {label} matched no leaf")
    if target is not None:
        if not diffs:
            out.print(f"matches --target {target}: every name, shape and dtype")
        else:
            out.print(f"differs from --target {target} in {len(diffs)} leaves:")
            for d in diffs:
                out.print(f"  {d.text()}")
