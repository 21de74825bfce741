"""Keep the C allocator from hoarding memory while TensorStore's threads stream large blocks.

glibc gives each busy thread its own malloc arena and, after a large block is freed, raises its
mmap threshold so that later blocks of that size come from those arenas, where freed memory
stays resident. With TensorStore's thread pools moving tens of MiB per block, peak RSS of a
reshard under ``--memory-limit 1GiB`` measured 1.8 GiB that way; capping arenas at 4 and sending
every allocation of 4 MiB or more to mmap (returned to the OS on free) measured 0.9 GiB at the
same speed (bench/bench_reshard.py). Other C libraries and platforms: nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_done = False


def bound_allocator(arenas: int = 4, mmap_threshold: int = 4 << 20) -> bool:
    """Apply the settings once per process (before heavy threads start); True when applied."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # musl and others have no mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _done = bool(mallopt(_M_ARENA_MAX, arenas)) and bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
    return _done
