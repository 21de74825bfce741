"""Text of ``ckpt du``: a table sorted by size with bars (80 columns), then the garbage."""

from __future__ import annotations

from ckpt_cli.commands._text import emit, human_bytes, painter, plural, use_color, wrap
from ckpt_cli.core.du.types import LEFTOVER_KINDS, UNLISTED_KINDS, DuReport, Garbage, ratio

WIDTH = 80
NAME = 31
BAR = 12
#: One row: its label, stored bytes, logical bytes (None: unknown or not arrays).
Row = tuple[str, int, int | None]


def default_by(report: DuReport) -> str:
    return {"root": "step", "step": "item"}.get(report.kind, "leaf")


def rows(report: DuReport, by: str) -> list[Row]:
    """The table's rows, largest first (ties by label)."""
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
    out.sort(key=lambda r: (-r[1], r[0]))
    return out


def _cut(text: str, width: int) -> str:
    """``text`` in ``width`` columns: the middle elided, both ends kept."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep // 2] + "…" + text[len(text) - (keep - keep // 2) :]


def _bar(part: int, whole: int) -> str:
    eighths = round(BAR * 8 * part / whole) if whole else 0
    return ("█" * (eighths // 8) + ("▏▎▍▌▋▊▉"[eighths % 8 - 1] if eighths % 8 else "")).ljust(BAR)


def table(report: DuReport, by: str, top: int) -> list[str]:
    """The header and rows: each line at most 80 columns."""
    all_rows = rows(report, by)
    shown = all_rows[:top] if top else all_rows
    whole = report.total_bytes
    lines = [f"{by:<{NAME}} {'size':>9} {'%':>6} {'':<{BAR}} {'logical':>9} {'ratio':>6}"]
    for label, size, logical in shown:
        r = ratio(size, logical)
        lines.append(
            f"{_cut(label, NAME):<{NAME}} {human_bytes(size):>9} "
            f"{100 * size / whole if whole else 0:>5.1f}% {_bar(size, whole)} "
            f"{human_bytes(logical) if logical is not None else '-':>9} "
            f"{f'{r:.2f}' if r is not None else '-':>6}"
        )
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
    return wrap(text, WIDTH)


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
        out += wrap(text, WIDTH, first="  ", indent="    ")
        if i + 1 == len(ordered) or ordered[i + 1].hint != g.hint:
            hint = _as_typed(g.hint, report, typed) if report else g.hint
            out += wrap("-> " + hint, WIDTH, first="    ", indent="       ")
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
    return wrap(("duplicates: " if not report.duplicates else "  ") + text, WIDTH, indent="    ")


def duplicate_lines(report: DuReport, top: int, typed: str | None = None) -> list[str]:
    """Leaves stored with equal values in several steps (digests recorded or, ``--deep``,
    computed), then the leaves not compared."""
    dups = report.duplicates
    if not dups:
        return _uncompared(report, typed)
    out = wrap(
        f"duplicates: {plural(len(dups), 'leaf', 'leaves')} stored again in several steps; "
        f"one copy each would save {human_bytes(report.duplicate_bytes)}",
        WIDTH,
        indent="    ",
    )
    shown = dups[:top] if top else dups
    for d in shown:
        steps = ",".join("-" if s is None else str(s) for s in d.steps)
        leaf = d.leaf or "''"
        out += wrap(
            f"{human_bytes(d.saved_bytes)} {d.item} {leaf} (steps {steps})",
            WIDTH,
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
        for line in wrap(f"note: {_as_typed(i.path, report, typed)}: {i.note}", WIDTH)
    ]
    return out + [line for note in report.notes for line in wrap(f"note: {note}", WIDTH)]


def print_report(report: DuReport, by: str | None, top: int, typed: str | None = None) -> None:
    """The report as text; ``typed``: PATH as given on the command line."""
    color = use_color()
    paint = painter(color)
    by = by or default_by(report)
    out = [paint(_cut(report.path, WIDTH), "bold")]
    out += [paint(line, "") for line in table(report, by, top)]
    out += [paint(line, "") for line in summary(report)]
    style = "yellow" if report.garbage else ""
    out += [paint(line, style) for line in garbage_lines(report.garbage, report, typed)]
    out += [paint(line, "") for line in duplicate_lines(report, top, typed)]
    out += [paint(line, "") for line in notes(report, typed)]
    emit(out, color)
