"""Text of ``ckpt migrate``: the plan per destination leaf, what is dropped and unused, and how
the result compares with ``--target``."""

from __future__ import annotations

from ckpt_cli.commands._text import (
    emit,
    human_bytes,
    painter,
    plural,
    say,
    shape_str,
    table_lines,
    use_color,
)
from ckpt_cli.core.migrate.plan import DestLeaf, MigrationPlan
from ckpt_cli.core.spec.tree import followed_families


def print_plan(plan: MigrationPlan) -> None:
    """One table per item (headed by its name when the step's items migrate together), then
    the counts, what is dropped, skipped and unused, and the comparison with ``--target``."""
    target, diffs = plan.target, plan.differences
    color = use_color()
    items = plan.items
    for item in items:
        if len(items) > 1:
            say(f"item {item.source.name}:", color)
        _print_leaves(item.leaves, color)
    leaves = [leaf for item in items for leaf in item.leaves]
    dropped = [name for item in items for name in item.dropped]
    changed = sum(leaf.changed for leaf in leaves)
    several = f" in {len(items)} items" if len(items) > 1 else ""
    say(
        f"{plural(len(leaves), 'leaf', 'leaves')}{several}: {changed} changed, "
        f"{len(leaves) - changed} unchanged; {len(dropped)} dropped; "
        f"{human_bytes(plan.total_bytes)} to write",
        color,
    )
    labels = {rule.index: rule.label for rule in plan.spec.rules}
    for index, families in sorted(followed_families(tuple(leaves)).items()):
        moved = ", ".join(f"{name} ({plural(n, 'leaf', 'leaves')})" for name, n in families.items())
        say(f"{labels[index]} also changed {moved}", color)
    if dropped:
        say("dropped: " + ", ".join(dropped), color)
    for skip in plan.skipped:
        say(f"skipped: {skip.text()}", color)
    for label in plan.unused_rules:
        say(f"unused: {label} matched no leaf", color)
    if target is not None:
        if not diffs:
            say(f"matches --target {target}: every name, shape and dtype", color)
        else:
            say(f"differs from --target {target} in {plural(len(diffs), 'leaf', 'leaves')}:", color)
            for d in diffs:
                say(d.text(), color, indent="  ")


def _print_leaves(planned: tuple[DestLeaf, ...], color: bool) -> None:
    paint = painter(color)
    rows = []
    for leaf in planned:
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
    headers = ["leaf", "array", "from", "operations"]
    if not any(row[2][0] for row in rows):  # nothing renamed or new: no empty column
        headers, rows = headers[:2] + headers[3:], [row[:2] + row[3:] for row in rows]
    emit(table_lines(headers, rows, paint, wrap_last=True), color)
