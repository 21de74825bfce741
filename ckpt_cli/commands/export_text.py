"""Text renderer of ``ckpt export``: one line per tensor, then a summary (``import_text`` shows
its rule steps with ``ops`` too)."""

from __future__ import annotations

from typing import Any

from ckpt_cli.commands._text import human_bytes, print_table, say, shape_str, use_color


def ops(steps: Any) -> str:
    return ", ".join(f"{s.op} {s.detail}" if s.op != "rename" else "rename" for s in steps)


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
                ops(t.steps) or "unchanged",
            ]
        )
    print_table(
        ("tensor", "array", "file", "from", "operations"), rows, frozenset({"file", "from"})
    )
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
