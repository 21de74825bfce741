"""Fast line rendering for outputs that can be huge (10,000-leaf trees and tables).

Rich's Tree and Table measure every cell and take seconds on 10,000 rows; these helpers build
plain lines with box-drawing prefixes and fixed columns, coloured through Rich markup only when
stdout is a terminal (one ``print`` of the whole text), written raw otherwise. Tables fit the
terminal's width (``render/layout.py``: wrapped at spaces, else one block per row, never a word
cut); through a pipe they are one line per row, never padded.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable, Sequence

from rich.markup import escape

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render import layout
from ckpt_cli.commands.render.layout import Paint

__all__ = ["Paint", "emit", "painter", "say", "table_lines", "text_width", "tree_lines"]


def text_width() -> int | None:
    """Columns the text must fit: the terminal's (``COLUMNS`` overrides its size, as for every
    tool); through a pipe none: lines are never wrapped for a script or a log."""
    if sys.stdout.isatty():
        return max(20, shutil.get_terminal_size().columns)
    return None


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
    *,
    wrap_last: bool = False,
    width: int | bool | None = True,
    show_header: bool = True,
) -> list[str]:
    """Aligned columns; each cell is (text, style), widths taken from the plain text. They fit
    ``width`` (default: the terminal's, ``text_width()``): the last column wrapped at spaces when
    ``wrap_last`` (free text: notes, reasons, operations), else one block per row."""
    columns = text_width() if width is True else (None if width is False else width)
    assert not isinstance(columns, bool)
    return layout.table(
        headers,
        rows,
        paint,
        width=columns,
        right=right,
        wrap_column=len(headers) - 1 if wrap_last else None,
        show_header=show_header,
    )


def say(text: str, color: bool, style: str = "", indent: str = "") -> None:
    """One message, wrapped at spaces to the terminal (one line through a pipe)."""
    emit(said(text, color, style, indent), color)


def said(text: str, color: bool, style: str = "", indent: str = "") -> list[str]:
    """The lines ``say`` writes, for output built whole before it is written."""
    paint = painter(color)
    lines = layout.wrap(text, text_width(), first=indent, indent=indent + "  ")
    return [paint(line, style) for line in lines]
