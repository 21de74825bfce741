"""Where output goes: the consoles, JSON documents, warnings, and the one progress bar.

Data goes to stdout, hints, warnings and progress to stderr. A JSON document is a result's own
``to_json()``, written as strict JSON (no bare NaN or Infinity: ``core.schema.finite``). Progress of every long operation arrives as ``core.progress.Progress`` events and
is shown by one Rich bar on stderr, only when stderr is a terminal and the output is not JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console

if TYPE_CHECKING:
    from ckpt_cli.core.progress import Progress, ProgressFn


class Document(Protocol):
    def to_json(self) -> Mapping[str, Any]: ...


def stdout_console() -> Console:
    # Piped output (logs, CI) is never wrapped nor padded: one line per line, as printed.
    tty = sys.stdout.isatty()
    return Console(highlight=False, soft_wrap=not tty, width=None if tty else 1 << 16)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def emit_json(result: Document) -> None:
    """Print ``result.to_json()`` as one document on stdout."""
    _write_document(result.to_json())


def _write_document(doc: Any) -> None:
    """One document on stdout, strict JSON: a NaN or Inf that reached it (its result should
    have written it null with ``<key>_nonfinite`` beside, ``core.schema.finite``) is written
    null and named in a warning, never as the bare ``NaN``/``Infinity`` that JSON parsers
    outside Python refuse."""
    # Indented for a person at a terminal; compact for pipes, where indent=2 would push json
    # onto its slow pure-Python encoder (7x slower on 10,000 leaves, bench/).
    indent = 2 if sys.stdout.isatty() else None
    try:
        text = json.dumps(doc, indent=indent, default=str, allow_nan=False)
    except ValueError:
        from ckpt_cli.core.schema.finite import split_nonfinite

        doc, where = split_nonfinite(doc)
        if not where:
            raise
        shown = ", ".join(sorted(where)[:3]) + (", ..." if len(where) > 3 else "")
        warn(f"{len(where)} NaN/Inf value(s) written as null (JSON has neither): {shown}")
        text = json.dumps(doc, indent=indent, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")


def warn(message: str) -> None:
    sys.stderr.write(f"ckpt: warning: {message}\n")


def note(message: str) -> None:
    """A line for the person at the terminal (stderr), not part of the output."""
    sys.stderr.write(f"ckpt: {message}\n")


#: What every --dry-run says last, on stderr (prune, migrate, reshard, export, import, cp).
DRY_RUN_NOTE = "dry run: nothing was changed"


def dry_run_note() -> None:
    """The last line of every dry run (stderr): the plan shown was not carried out."""
    sys.stderr.write(DRY_RUN_NOTE + "\n")


_LABELS = {
    "structure": "checking structure",
    "data": "reading data",
    "stats": "stats",
    "hide": "hiding",
    "delete": "deleting",
    "copy": "copying",
}
#: Actions shown on one bar (prune hides, then deletes).
_BARS = {"hide": "prune", "delete": "prune"}


@contextmanager
def progress_bar(enabled: bool, min_bytes: int = 0) -> Iterator[ProgressFn | None]:
    """A ``ProgressFn`` drawing one transient Rich bar per action on stderr, or None when
    ``enabled`` is False or stderr is no terminal. Byte counts smaller than ``min_bytes`` in
    total get no bar (work that ends before a bar is worth drawing)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress as Bars

    with Bars(*_columns(), console=stderr_console(), transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(event: Progress) -> None:
            if event.unit == "bytes" and (event.total or 0) < min_bytes:
                return
            key = _BARS.get(event.action, event.action)
            label = _LABELS.get(event.action, event.action)
            if event.name and event.action in _BARS:
                label = f"{label} {event.name}"
            total = event.total or None
            if key not in tasks:
                tasks[key] = bar.add_task(label, total=total, unit=event.unit)
            bar.update(tasks[key], description=label, completed=event.done, total=total)

        yield update


def _columns() -> list[Any]:
    """The bar's columns: what, bar, amount, rate, time left."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        ProgressColumn,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    from ckpt_cli.core.units import human_bytes

    class Amount(ProgressColumn):
        """Bytes in the units the text uses (``12.0/64.0 MiB``, never decimal MB), anything else
        as a percentage."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes, self.other = DownloadColumn(binary_units=True), TaskProgressColumn()

        def render(self, task: Any) -> Text:
            column = self.bytes if task.fields.get("unit") == "bytes" else self.other
            return column.render(task)

    class Rate(ProgressColumn):
        """Bytes per second (``41.3 MiB/s``), binary units as above."""

        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            if task.fields.get("unit") != "bytes":
                return Text("")
            return Text("?" if speed is None else f"{human_bytes(int(speed))}/s")

    return [TextColumn("{task.description}"), BarColumn(), Amount(), Rate(), TimeRemainingColumn()]


def emit_error(version: int, error: Mapping[str, Any], result: object = None) -> None:
    """The one document of a failed ``--json`` run: what the command computed before it failed
    (``CkptError.result``, a refused prune's plan) or nothing, with ``ok`` false and the error;
    ``version`` is the failed command's ``schema_version``."""
    doc: dict[str, Any] = dict(result) if isinstance(result, Mapping) else {}
    _write_document({"schema_version": version, **doc, "ok": False, "error": error})
