"""CRC-32 (zlib's polynomial and values) at memory speed: ISA-L's (``isal``, a dependency)
when its wheel is installed, else zlib's. Both give the GIL up while they sum, so ranges of a
file are summed on several threads at once (``filesums``).

zlib 1.2 (Python's on most Linux distributions) sums about 1-1.3 GB/s on one core of the build
machine; ISA-L's carry-less-multiply loop 5-20 GB/s, so the CRC-32 pass of ``verify``, of a
writer reading its output back and of ``cp`` costs a fraction of the read."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from typing import Any

_crc32: Callable[[Any, int], int] | None = None
_combine: Callable[[int, int, int], int] | None = None


def _pick() -> Callable[[Any, int], int]:
    global _crc32
    if _crc32 is None:
        try:
            from isal import isal_zlib

            _crc32 = isal_zlib.crc32
        except ImportError:  # no wheel for this platform: the same values, slower
            _crc32 = zlib.crc32
    return _crc32


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``: ISA-L's (0.15 us
    here), else zlib's algorithm in Python (``combine_py``, about 1.5 ms)."""
    global _combine
    if _combine is None:
        try:
            from isal import isal_zlib

            _combine = isal_zlib.crc32_combine
        except ImportError:
            _combine = combine_py
    return _combine(crc1, crc2, len2)


def combine_py(crc1: int, crc2: int, len2: int) -> int:
    """zlib's ``crc32_combine`` (which Python's ``zlib`` does not expose): ``len2`` zero bytes
    applied to ``crc1``, one GF(2) operator per set bit of ``len2`` (``_zeros``), then ``crc2``
    added. The operators are made once per process (zlib squares them again on every call:
    4 ms a call on the TPU host, 0.5 s of a 6 GiB ``verify --deep`` without ISA-L)."""
    for bit in range(len2.bit_length() if len2 > 0 else 0):
        if len2 >> bit & 1:
            crc1 = _gf2_times(_zeros(bit), crc1)
    return crc1 ^ crc2


#: ``_ZEROS[k]``: the operator that appends ``2**k`` zero bytes to a CRC-32 (zlib's reflected
#: polynomial), made by squaring the one-zero-bit operator.
_ZEROS: list[list[int]] = []
_ZEROS_LOCK = threading.Lock()


def _zeros(k: int) -> list[int]:
    if k < len(_ZEROS):
        return _ZEROS[k]
    with _ZEROS_LOCK:  # threads summing ranges at once: each operator appended once, in order
        if not _ZEROS:
            op = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
            for _ in range(3):
                op = _gf2_square(op)  # two, four, eight zero bits: one zero byte
            _ZEROS.append(op)
        while len(_ZEROS) <= k:
            _ZEROS.append(_gf2_square(_ZEROS[-1]))
        return _ZEROS[k]


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def crc32(data: Any, value: int = 0) -> int:
    """``zlib.crc32(data, value)``: the CRC-32 of ``data`` continued from ``value``."""
    return (_crc32 or _pick())(data, value)


def backend() -> str:
    """Which implementation sums: ``isal`` or ``zlib`` (tests, the bench)."""
    return "isal" if _pick() is not zlib.crc32 else "zlib"
