"""Amounts, ages and shapes as people read them (text renderers only)."""

from __future__ import annotations

from datetime import datetime, timezone

from ckpt_cli.core.units import human_bytes

__all__ = ["human_age", "human_bytes", "human_count", "shape_str"]


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
