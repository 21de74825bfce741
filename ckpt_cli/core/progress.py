"""Progress of long work: one event type and one callback type for every operation.

Operations that take a while (verify, diff, inspect --stats, reshard, migrate, prune) accept
``on_progress: ProgressFn | None`` and call it with ``Progress`` events; the CLI shows them as one
Rich bar on stderr (``commands/_output.py``), a library user may log them. Events of one
``action`` report a growing ``done`` out of ``total`` (None when unknown).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Unit = Literal["items", "bytes"]


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` units of ``action`` (e.g. ``data``, ``reshard``, ``delete``),
    optionally naming the thing being worked on (a step, a leaf)."""

    action: str
    name: str | None
    done: int
    total: int | None
    unit: Unit = "items"


ProgressFn = Callable[[Progress], None]


class ByteProgress:
    """A thread-safe byte counter (``counter(n)`` adds ``n`` bytes) that reports to a
    ``ProgressFn`` as ``action``: the adapter between the block pipelines and the caller."""

    def __init__(self, on_progress: ProgressFn | None, action: str, total: int | None) -> None:
        self.on_progress = on_progress
        self.action = action
        self.total = total
        self.done = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self.on_progress is not None:
                self.on_progress(Progress(self.action, None, self.done, self.total, "bytes"))
