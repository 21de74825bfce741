"""Progress columns in the units the text uses: bytes in KiB/MiB/GiB, a rate, the time left.

Rich's ``DownloadColumn`` and ``TransferSpeedColumn`` count in decimal MB by default, while every
size ckpt prints is binary (``256.0 MiB``): the bar would say ``268.4 MB`` for the same leaf.
"""

from __future__ import annotations

from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def binary(n: float) -> str:
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} {_UNITS[-1]}"  # pragma: no cover - the loop returns


class RateColumn(ProgressColumn):
    """Bytes per second, binary units (``41.3 MiB/s``); ``?`` until Rich has a speed."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("?" if speed is None else f"{binary(speed)}/s", style="progress.data.speed")


def byte_columns() -> tuple[Any, ...]:
    """Description, bar, ``done/total MiB``, rate, time left."""
    return (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        RateColumn(),
        TimeRemainingColumn(),
    )
