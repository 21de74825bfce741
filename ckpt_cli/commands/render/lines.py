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


#: Levels drawn as a tree; below that, each leaf is one line holding the rest of its dotted path,
#: so the output stays linear in the size of the tree whatever its depth.
MAX_TREE_DEPTH = 32


class _Node:
    __slots__ = ("children", "label")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.label: str | None = None


def tree_lines(root: str, leaves: Iterable[tuple[Sequence[str], str]], paint: Paint) -> list[str]:
    """Lines of a tree from (path, label) pairs given in tree order (siblings contiguous)."""
    top = _Node()
    for path, label in leaves:
        node = top
        for depth, key in enumerate(path):
            if depth == MAX_TREE_DEPTH and len(path) > depth + 1:
                key = ".".join(path[depth:])  # the rest of a very deep path, on one line
                node = node.children.setdefault(key, _Node())
                break
            node = node.children.setdefault(key, _Node())
        node.label = label
    out = [paint(root, "bold")]
    # Iterative, so a deep tree cannot exhaust the interpreter's stack.
    stack: list[tuple[str, list[tuple[str, _Node]]]] = [("", list(top.children.items())[::-1])]
    while stack:
        prefix, pending = stack[-1]
        if not pending:
            stack.pop()
            continue
        name, node = pending.pop()
        last = not pending
        branch = "└── " if last else "├── "
        if node.children:
            out.append(prefix + branch + paint(name, "bold"))
            if node.label is not None:
                out[-1] += "  " + node.label
            child_prefix = prefix + ("    " if last else "│   ")
            stack.append((child_prefix, list(node.children.items())[::-1]))
        else:
            out.append(prefix + branch + paint(name, "") + "  " + (node.label or ""))
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
