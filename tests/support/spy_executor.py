"""An executor for tests that runs the units in this process and keeps every unit it ran."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ckpt_cli.core.executor import InlineExecutor


class Spy(InlineExecutor):
    """Runs the units here and keeps them."""

    def __init__(self) -> None:
        self.units: list[Any] = []

    def map(self, fn: Callable[[Any], Any], units: Iterable[Any], on_done: Any = None) -> Any:
        taken = list(units)
        self.units.extend(taken)
        return super().map(fn, taken, on_done)
