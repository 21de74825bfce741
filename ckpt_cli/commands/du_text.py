"""Text of ``ckpt du``: a table with bars (steps in step order, items and leaves largest first),
then the garbage. Names are never cut: the name column is as wide as the longest name; on a
terminal too narrow for it, a longer name stands alone on its line, its figures below it."""

from __future__ import annotations

from ckpt_cli.commands._text import (
    emit,
    human_bytes,
    painter,
    plural,
    text_width,
    use_color,
    wrap,
)
from ckpt_cli.core.du.types import LEFTOVER_KINDS, UNLISTED_KINDS, DuReport, Garbage, ratio

WIDTH = 80
NAME = 31
BAR = 12
#: The columns after the name: size, %, the bar, logical, ratio, and the spaces between them.
FIGURES = 9 + 1 + 6 + 1 + BAR + 1 + 9 + 1 + 6
#: One row: its label, stored bytes, logical bytes (None: unknown or not arrays).
Row = tuple[str, int, int | None]


def _width() -> int:
    """Where prose lines wrap: 80 columns, or a narrower terminal's (``COLUMNS``)."""
    return min(WIDTH, text_width() or WIDTH)


def default_by(report: DuReport) -> str:
    return {"root": "step", "step": "item"}.get(report.kind, "leaf")


def rows(report: DuReport, by: str) -> list[Row]:
    """The table's rows: steps in the report's order (by step number: a run reads as a
    timeline), items and leaves largest first (ties by label)."""
    out: list[Row] = []
    several_steps = len(report.steps) > 1
    for s in report.steps:
        step = s.name if s.step is None else str(s.step)
        if by == "step":
            out.append((step or "-", s.bytes, s.logical_bytes or None))
            continue
        several_items = len(s.items) > 1
        for i in s.items:
            if by == "item":
                label = f"{step}/{i.name}" if several_steps else i.name
                out.append((label, i.bytes, i.logical_bytes if i.leaves else None))
                continue
            for leaf in i.leaves:
                parts = [step] if several_steps else []
                parts += [i.name] if several_items else []
                out.append((" ".join([*parts, leaf.name or "''"]), leaf.bytes, leaf.logical_bytes))
    if by != "step":
        out.sort(key=lambda r: (-r[1], r[0]))
    return out


def _largest(all_rows: list[Row], top: int) -> list[Row]:
    """The ``top`` largest rows (0: all), in the order of ``all_rows``."""
    if not top or len(all_rows) <= top:
        return all_rows
    keep = set(sorted(range(len(all_rows)), key=lambda i: (-all_rows[i][1], i))[:top])
    return [r for i, r in enumerate(all_rows) if i in keep]


def _bar(part: int, whole: int) -> str:
    eighths = round(BAR * 8 * part / whole) if whole else 0
    return ("█" * (eighths // 8) + ("▏▎▍▌▋▊▉"[eighths % 8 - 1] if eighths % 8 else "")).ljust(BAR)


def name_width(labels: list[str], by: str, width: int | None) -> int:
    """The name column: at least ``NAME``, as wide as the longest label; on a terminal
    (``width``) no wider than the figures leave room for (a longer label then has a line of
    its own)."""
    longest = max([len(by), *(len(label) for label in labels)])
    if width is None:
        return max(NAME, longest)
    return max(len(by), min(max(NAME, longest), width - 1 - FIGURES))


def table(report: DuReport, by: str, top: int, width: int | None = None) -> list[str]:
    """The header and rows, fitting ``width`` columns (None, a pipe: as wide as the names),
    every name whole."""
    all_rows = rows(report, by)
    shown = _largest(all_rows, top)
    name = name_width([label for label, _, _ in shown], by, width)
    whole = report.total_bytes
    lines = [f"{by:<{name}} {'size':>9} {'%':>6} {'':<{BAR}} {'logical':>9} {'ratio':>6}"]
    for label, size, logical in shown:
        r = ratio(size, logical)
        figures = (
            f"{human_bytes(size):>9} "
            f"{100 * size / whole if whole else 0:>5.1f}% {_bar(size, whole)} "
            f"{human_bytes(logical) if logical is not None else '-':>9} "
            f"{f'{r:.2f}' if r is not None else '-':>6}"
        )
        if len(label) > name:  # never cut: the name alone, its figures on the next line
            lines += [label, f"{'':<{name}} {figures}"]
        else:
            lines.append(f"{label:<{name}} {figures}")
    if len(all_rows) > len(shown):
        lines.append(f"... {plural(len(all_rows) - len(shown), 'more row')} (--top 0 shows all)")
    return lines


def summary(report: DuReport) -> list[str]:
    inside = sum(g.bytes for g in report.garbage if g.kind not in LEFTOVER_KINDS)
    text = (
        f"total {human_bytes(report.total_bytes)} = "
        f"{plural(len(report.steps), 'step')} {human_bytes(report.steps_bytes)}"
        f" + other files {human_bytes(report.other_bytes)}"
        f" + leftover saves {human_bytes(report.garbage_bytes - inside)}"
    )
    unlisted = [g for g in report.garbage if g.kind in UNLISTED_KINDS]
    if unlisted:
        text += (
            f"; besides, {plural(len(unlisted), 'open upload')} "
            f"{human_bytes(sum(g.bytes for g in unlisted))}"
        )
    return wrap(text, _width())


def _as_typed(text: str, report: DuReport, typed: str | None) -> str:
    """Paths as the user wrote the one on the command line (``runs/exp7/...``, not the
    absolute form the JSON carries): shorter lines, commands to paste as they are."""
    if typed is None or typed == report.path:
        return text
    return text.replace(report.path, typed.rstrip("/") or "/")


def _below(path: str, top: str) -> str:
    """A path under the report's own, relative to it (the title names that one)."""
    prefix = top.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def garbage_lines(
    garbage: tuple[Garbage, ...], report: DuReport | None = None, typed: str | None = None
) -> list[str]:
    if not garbage:
        return ["garbage: none"]
    total = sum(g.bytes for g in garbage)
    out = [
        f"garbage: {human_bytes(total)} in {plural(len(garbage), 'place')} (paths below the top one)"
    ]
    # By kind, largest first; the entries that share a hint, then the hint once.
    ordered = sorted(garbage, key=lambda g: (g.kind, -g.bytes, g.path))
    for i, g in enumerate(ordered):
        files = f", {plural(g.files, 'file')}" if g.files > 1 else ""
        path = _below(g.path, report.path) if report else g.path
        text = f"{human_bytes(g.bytes)} {g.kind}{files}: {path}"
        out += wrap(text, _width(), first="  ", indent="    ")
        if i + 1 == len(ordered) or ordered[i + 1].hint != g.hint:
            hint = _as_typed(g.hint, report, typed) if report else g.hint
            out += wrap("-> " + hint, _width(), first="    ", indent="       ")
    return out


def _uncompared(report: DuReport, typed: str | None) -> list[str]:
    """Why leaves found in several steps were not compared, and how to compare them."""
    n = report.uncompared_leaves
    if not n:
        return []
    path = typed or report.path
    if report.deep:
        text = f"{plural(n, 'leaf', 'leaves')} could not be read: not compared (`ckpt verify`)"
    else:
        text = (
            f"{plural(n, 'leaf', 'leaves')} in several steps without a recorded digest: not "
            f"compared; `ckpt du {path} --deep` reads and compares them (or `ckpt verify "
            f"{path} --deep --record` records digests once)"
        )
    return wrap(("duplicates: " if not report.duplicates else "  ") + text, _width(), indent="    ")


def duplicate_lines(report: DuReport, top: int, typed: str | None = None) -> list[str]:
    """Leaves stored with equal values in several steps (digests recorded or, ``--deep``,
    computed), then the leaves not compared."""
    dups = report.duplicates
    if not dups:
        return _uncompared(report, typed)
    out = wrap(
        f"duplicates: {plural(len(dups), 'leaf', 'leaves')} stored again in several steps; "
        f"one copy each would save {human_bytes(report.duplicate_bytes)}",
        _width(),
        indent="    ",
    )
    shown = dups[:top] if top else dups
    for d in shown:
        steps = ",".join("-" if s is None else str(s) for s in d.steps)
        leaf = d.leaf or "''"
        out += wrap(
            f"{human_bytes(d.saved_bytes)} {d.item} {leaf} (steps {steps})",
            _width(),
            first="  ",
            indent="    ",
        )
    if len(dups) > len(shown):
        out.append(f"  ... {plural(len(dups) - len(shown), 'more leaf', 'more leaves')}")
    return out + _uncompared(report, typed)


def notes(report: DuReport, typed: str | None = None) -> list[str]:
    out = [
        line
        for s in report.steps
        for i in s.items
        if i.note
        for line in wrap(f"note: {_as_typed(i.path, report, typed)}: {i.note}", _width())
    ]
    return out + [line for note in report.notes for line in wrap(f"note: {note}", _width())]


def print_report(report: DuReport, by: str | None, top: int, typed: str | None = None) -> None:
    """The report as text; ``typed``: PATH as given on the command line."""
    color = use_color()
    paint = painter(color)
    by = by or default_by(report)
    out = [paint(report.path, "bold")]
    out += [paint(line, "") for line in table(report, by, top, text_width())]
    out += [paint(line, "") for line in summary(report)]
    style = "yellow" if report.garbage else ""
    out += [paint(line, style) for line in garbage_lines(report.garbage, report, typed)]
    out += [paint(line, "") for line in duplicate_lines(report, top, typed)]
    out += [paint(line, "") for line in notes(report, typed)]
    emit(out, color)
