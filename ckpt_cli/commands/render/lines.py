"""Fast line rendering for outputs that can be huge (10,000-leaf trees and tables).

Rich's Tree and Table measure every cell and take seconds on 10,000 rows; these helpers build
plain lines with box-drawing prefixes and fixed columns, coloured through Rich markup only when
stdout is a terminal (one ``print`` of the whole text), written raw otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence

from rich.markup import escape

from ckpt_cli.commands._output import stdout_console

Paint = Callable[[str, str], str]


def painter(color: bool) -> Paint:
    """``paint(text, style)``: Rich markup when colouring, the text itself otherwise."""
    if color:
        return lambda text, style: f"[{style}]{escape(text)}[/]" if style else escape(text)
    return lambda text, style: text


def use_color() -> bool:
    return sys.stdout.isatty()


def emit(lines: Iterable[str], color: bool) -> None:
    text = "\n".join(lines)
    if color:
        stdout_console().print(text, highlight=False, soft_wrap=True)
    else:
        sys.stdout.write(text + "\n")


def tree_lines(root: str, leaves: Iterable[tuple[Sequence[str], str]], paint: Paint) -> list[str]:
    """Lines of a tree from (path, label) pairs given in tree order (siblings contiguous)."""
    items = [(tuple(path), label) for path, label in leaves]
    # A node is its branch's last child when no later entry shares its parent prefix.
    seen_parent: dict[tuple[str, ...], tuple[str, ...]] = {}
    for path, _ in items:
        for depth in range(1, len(path) + 1):
            seen_parent[path[: depth - 1]] = path[:depth]
    last_child = set(seen_parent.values())
    out = [paint(root, "bold")]
    opened: set[tuple[str, ...]] = set()
    for path, label in items:
        for depth in range(1, len(path) + 1):
            node = path[:depth]
            if node in opened and depth < len(path):
                continue
            prefix = "".join("    " if path[:d] in last_child else "│   " for d in range(1, depth))
            branch = "└── " if node in last_child else "├── "
            if depth < len(path):
                opened.add(node)
                out.append(prefix + branch + paint(node[-1], "bold"))
            else:
                out.append(prefix + branch + paint(node[-1], "") + "  " + label)
    return out


def table_lines(
    headers: Sequence[str],
    rows: Sequence[Sequence[tuple[str, str]]],
    paint: Paint,
    right: frozenset[int] = frozenset(),
) -> list[str]:
    """Aligned columns; each cell is (text, style), widths taken from the plain text."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def fmt(cells: Sequence[tuple[str, str]]) -> str:
        parts = []
        for i, (text, style) in enumerate(cells):
            pad = " " * (widths[i] - len(text))
            parts.append(pad + paint(text, style) if i in right else paint(text, style) + pad)
        return "  ".join(parts).rstrip()

    return [fmt([(h, "bold") for h in headers]), *(fmt(r) for r in rows)]
