"""A Rich progress bar on stderr behind the core's ``on_progress(phase, done, total)`` callback.

Shown only when stderr is a terminal and the output is not JSON: CI logs and pipes get none.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ProgressFn = Callable[[str, int, int], None]

_LABELS = {"structure": "checking structure", "data": "reading data"}


@contextmanager
def progress_bar(enabled: bool) -> Iterator[ProgressFn | None]:
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
        transient=True,
    ) as progress:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(_LABELS.get(phase, phase), total=total or None)
            progress.update(tasks[phase], completed=done, total=total or None)

        yield update
