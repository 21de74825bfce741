"""The text primitives every command's renderer shares: layout, lines, units.

**Layout** (``table``, ``wrap``): text that fits the terminal. Tables fold instead of cutting
words, text is wrapped at spaces. Every renderer builds plain cells; these functions lay them out
for a width (the terminal's, or ``COLUMNS`` through a pipe) or for none (a pipe without
``COLUMNS``: one line per row, never wrapped, never padded).
Nothing here cuts a word or a name: a column that does not fit is wrapped at spaces, and when even
that cannot fit, each row becomes a small block (its key on one line, the other columns indented
below it). Trailing spaces are never written. Styles are applied after the layout, through a
``Paint`` function, so widths are always measured on the plain text.

**Lines** (``tree_lines``, ``table_lines``, ``emit``, ``say``): fast rendering for outputs that
can be huge (10,000-leaf trees and tables). Rich's Tree and Table measure every cell and take
seconds on 10,000 rows; these build plain lines with box-drawing prefixes and fixed columns,
coloured through Rich markup only when stdout is a terminal (one ``print`` of the whole text),
written raw otherwise.

**Units** (``human_bytes``, ``human_count``, ``human_age``, ``shape_str``): amounts, ages and
shapes as people read them.

Renderers (``commands/<command>_text.py``) only turn results into text: they never read array
data, never decide, and never build JSON (a result's JSON is its own ``to_json()``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone

from rich.markup import escape

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.core.units import human_bytes

__all__ = [
    "Paint",
    "emit",
    "human_age",
    "human_bytes",
    "human_count",
    "natural_width",
    "painter",
    "plural",
    "print_table",
    "said",
    "say",
    "shape_str",
    "table",
    "table_lines",
    "text_width",
    "tree_lines",
    "use_color",
    "wrap",
]

Paint = Callable[[str, str], str]
Cell = tuple[str, str]  # (text, style)

#: A column narrower than this is not worth wrapping into: the row becomes a block instead.
MIN_WRAP = 16
GAP = "  "


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``, ``0 leaves`` (``many`` for irregular plurals)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def wrap(text: str, width: int | None, *, first: str = "", indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken at spaces only: the first line
    starts with ``first``, the others with ``indent``; a word longer than a line stands alone
    on its line rather than being cut. ``width`` None: one line."""
    if width is None or len(first) + len(text) <= width:
        return [(first + text).rstrip()]
    words = text.split()
    lines: list[str] = []
    line = first
    bare = True  # nothing but the prefix on this line yet
    for word in words:
        if not bare and len(line) + 1 + len(word) > width:
            lines.append(line)
            line, bare = indent, True
        if bare and line and len(line) + len(word) > width >= len(word):
            line = ""  # a long path fits the line without its indent: never cut it
        line = line + word if bare else f"{line} {word}"
        bare = False
    lines.append(line)
    return [x.rstrip() for x in lines]


def _widths(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[int]:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    return widths


def natural_width(headers: Sequence[str], rows: Sequence[Sequence[Cell]], indent: int = 0) -> int:
    return indent + sum(_widths(headers, rows)) + len(GAP) * (len(headers) - 1)


def _cells(
    cells: Sequence[Cell], widths: Sequence[int], paint: Paint, right: frozenset[int]
) -> str:
    parts = []
    for i, (text, style) in enumerate(cells):
        pad = " " * (widths[i] - len(text))
        parts.append(pad + paint(text, style) if i in right else paint(text, style) + pad)
    return GAP.join(parts)


Groups = list[list[str]]  # the header's lines, then each row's lines


def _aligned(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    paint: Paint,
    right: frozenset[int],
    indent: str = "",
) -> Groups:
    widths = _widths(headers, rows)
    return [
        [(indent + _cells(cells, widths, paint, right)).rstrip()]
        for cells in [[(h, "bold") for h in headers], *rows]
    ]


def _wrapped(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    paint: Paint,
    right: frozenset[int],
    width: int,
    wrap_column: int | None,
    indent: str = "",
) -> Groups | None:
    """The last column (when it is ``wrap_column``) wrapped at spaces in the room the others
    leave, continuation lines starting at its column; None when that room is too narrow."""
    last = len(headers) - 1
    if wrap_column != last or last < 1:
        return None
    widths = _widths(headers[:last], [r[:last] for r in rows])
    start = len(indent) + sum(widths) + len(GAP) * last
    room = width - start
    longest_word = max((len(w) for r in rows for w in r[last][0].split()), default=0)
    if room < max(MIN_WRAP, longest_word, len(headers[last])):
        return None
    groups = []
    for cells in [[(h, "bold") for h in headers], *rows]:
        text, style = cells[last]
        pieces = wrap(text, room) if text else [""]
        lead = indent + _cells(cells[:last], widths, paint, right) + GAP
        group = [(lead + paint(pieces[0], style)).rstrip()]
        group += [(" " * start + paint(p, style)).rstrip() for p in pieces[1:]]
        groups.append(group)
    return groups


def _spilled(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    paint: Paint,
    right: frozenset[int],
    width: int,
) -> Groups | None:
    """The leading columns that fit, aligned; the others below each row as ``header: value``
    lines (the ones a narrow terminal has no room for: shown, never dropped)."""
    for keep in range(len(headers) - 1, 1, -1):
        if natural_width(headers[:keep], [r[:keep] for r in rows]) <= width:
            break
    else:
        return None
    head = _aligned(headers[:keep], [r[:keep] for r in rows], paint, right)
    groups = [head[0]]
    for row, line in zip(rows, head[1:], strict=True):
        groups.append(line + _fields(headers[keep:], row[keep:], paint, width, "    "))
    return groups


def _fields(
    headers: Sequence[str], row: Sequence[Cell], paint: Paint, width: int, indent: str
) -> list[str]:
    """One row's cells as ``header: value`` lines, values wrapped at spaces."""
    label = max((len(h) for h in headers), default=0) + 2
    out = []
    for header, (text, style) in zip(headers, row, strict=True):
        if not text:
            continue
        first = f"{indent}{(header + ':').ljust(label)}"
        for i, piece in enumerate(wrap(text, width, first=first, indent=" " * len(first))):
            head, value = (first, piece[len(first) :]) if i == 0 else ("", piece)
            out.append(((paint(head, "dim") if head else "") + paint(value, style)).rstrip())
    return out


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    paint: Paint,
    *,
    width: int | None,
    right: frozenset[int] = frozenset(),
    wrap_column: int | None = None,
    show_header: bool = True,
) -> list[str]:
    """Aligned columns when they fit ``width`` (or when there is no width: a pipe).

    Otherwise, in this order: the free-text column ``wrap_column`` (the last one) is wrapped at
    spaces when it keeps at least ``MIN_WRAP`` columns; else the leading columns that fit stay
    in the row and the others follow it as ``header: value`` lines; else every row becomes a
    block: its first cell (the key: a leaf name, a step) alone on a line, the other columns as
    an aligned table indented below it, or as ``header: value`` lines.
    """
    groups: Groups | None
    if width is None or natural_width(headers, rows) <= width:
        groups = _aligned(headers, rows, paint, right)
    else:
        groups = _wrapped(headers, rows, paint, right, width, wrap_column)
    if groups is None:
        assert width is not None
        groups = _spilled(headers, rows, paint, right, width)
    if groups is not None:
        return [line for group in groups[0 if show_header else 1 :] for line in group]
    assert width is not None
    indent = "    "
    rest_headers, rest = headers[1:], [r[1:] for r in rows]
    shifted = frozenset(i - 1 for i in right if i > 0)
    sub: Groups | None = None
    if rest_headers and natural_width(rest_headers, rest, len(indent)) <= width:
        sub = _aligned(rest_headers, rest, paint, shifted, indent)
    elif rest_headers and wrap_column is not None:
        sub = _wrapped(rest_headers, rest, paint, shifted, width, wrap_column - 1, indent)
    out: list[str] = []
    if sub is not None and show_header:
        out += [paint(headers[0], "bold"), *sub[0]]
    for i, row in enumerate(rows):
        out.append(paint(*row[0]).rstrip())
        out += (
            sub[i + 1] if sub is not None else _fields(rest_headers, row[1:], paint, width, indent)
        )
    return out


# --- lines ---


def text_width() -> int | None:
    """Columns the text must fit: the terminal's (``COLUMNS`` overrides its size, as for every
    tool); through a pipe ``COLUMNS`` when it is set (``COLUMNS=100 ckpt ls | less``), else
    none: lines are never wrapped for a script or a log."""
    if sys.stdout.isatty():
        return max(20, shutil.get_terminal_size().columns)
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(20, int(columns))
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
    return table(
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
    lines = wrap(text, text_width(), first=indent, indent=indent + "  ")
    return [paint(line, style) for line in lines]


def print_table(headers: Sequence[str], rows: list[list[str]], optional: frozenset[str]) -> None:
    """The rows as aligned columns; an ``optional`` column empty in every row is left out
    (``file`` of a single-file export, ``from`` when no tensor was renamed)."""
    keep = [
        i
        for i, header in enumerate(headers)
        if header not in optional or any(row[i] for row in rows)
    ]
    color = use_color()
    paint = painter(color)
    cells = [[(row[i], "") for i in keep] for row in rows]
    emit(table_lines([headers[i] for i in keep], cells, paint, wrap_last=True), color)


# --- units ---


def human_count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def human_age(then: datetime, now: datetime | None = None) -> str:
    seconds = ((now or datetime.now(timezone.utc)) - then).total_seconds()
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def shape_str(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"
