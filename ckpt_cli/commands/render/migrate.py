"""Text of ``ckpt migrate``: the plan per destination leaf, what is dropped and unused, and how
the result compares with ``--target``."""

from __future__ import annotations

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.lines import emit, painter, table_lines, use_color
from ckpt_cli.commands.render.units import human_bytes, shape_str
from ckpt_cli.core.migrate.plan import MigrationPlan


def print_plan(plan: MigrationPlan) -> None:
    target, diffs = plan.target, plan.differences
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
