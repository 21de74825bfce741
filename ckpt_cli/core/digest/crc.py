"""CRC-32 (zlib's polynomial and values) at memory speed: ISA-L's (``isal``, a dependency)
when its wheel is installed, else zlib's. Both give the GIL up while they sum, so ranges of a
file are summed on several threads at once (``filesums``).

zlib 1.2 (Python's on most Linux distributions) sums about 1-1.3 GB/s on one core of the build
machine; ISA-L's carry-less-multiply loop 5-20 GB/s, so the CRC-32 pass of ``verify``, of a
writer reading its output back and of ``cp`` costs a fraction of the read."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

_crc32: Callable[[Any, int], int] | None = None


def _pick() -> Callable[[Any, int], int]:
    global _crc32
    if _crc32 is None:
        try:
            from isal import isal_zlib

            _crc32 = isal_zlib.crc32
        except ImportError:  # no wheel for this platform: the same values, slower
            _crc32 = zlib.crc32
    return _crc32


def crc32(data: Any, value: int = 0) -> int:
    """``zlib.crc32(data, value)``: the CRC-32 of ``data`` continued from ``value``."""
    return (_crc32 or _pick())(data, value)


def backend() -> str:
    """Which implementation sums: ``isal`` or ``zlib`` (tests, the bench)."""
    return "isal" if _pick() is not zlib.crc32 else "zlib"
