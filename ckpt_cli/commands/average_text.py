"""Text of ``ckpt average``: each leaf with what it becomes (the mean, the last step's value,
dropped), then the steps and their weights."""

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
from ckpt_cli.core.average.plan import AverageItem, AveragePlan

_ACTION_TEXT = {"average": "mean", "last": "last step", "drop": "dropped"}
_ACTION_COLOR = {"average": "green", "last": "", "drop": "red"}


def print_plan(plan: AveragePlan) -> None:
    """One table per item (headed by its name when there are several), then the steps with
    their weights and the bytes to write."""
    color = use_color()
    for item in plan.items:
        if len(plan.items) > 1:
            say(f"item {item.source.name}:", color)
        _print_leaves(item, color)
    averaged = sum(a == "average" for item in plan.items for a in item.actions)
    how = f"EMA decay {plan.ema}" if plan.ema is not None else "weights"
    weights = ", ".join(f"{s}: {w:.4g}" for s, w in zip(plan.steps, plan.coefficients, strict=True))
    say(
        f"{plural(averaged, 'leaf', 'leaves')} averaged over steps {weights} ({how}); "
        f"optimizer state: {plan.optimizer}; step {plan.step_out}: "
        f"{human_bytes(plan.total_bytes)} to write",
        color,
    )
    if plan.dropped_items:
        say("dropped items: " + ", ".join(plan.dropped_items), color)


def _print_leaves(item: AverageItem, color: bool) -> None:
    paint = painter(color)
    rows = []
    for leaf, action in zip(item.report.leaves, item.actions, strict=True):
        if not leaf.is_array:
            continue
        rows.append(
            [
                (leaf.name, ""),
                (f"{leaf.dtype}{shape_str(leaf.shape)}", "cyan"),
                (_ACTION_TEXT[action], _ACTION_COLOR[action]),
                (human_bytes(leaf.size_bytes), ""),
            ]
        )
    emit(table_lines(["leaf", "array", "value", "bytes"], rows, paint, right=frozenset({3})), color)
