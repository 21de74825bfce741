"""Keep the C allocator from hoarding memory, and from faulting it in afresh, while
TensorStore's threads stream large blocks.

glibc gives each busy thread its own malloc arena and, after a large block is freed, raises its
mmap threshold so that later blocks of that size come from those arenas, where freed memory
stays resident. With TensorStore's thread pools moving tens of MiB per block, peak RSS of a
reshard under ``--memory-limit 1GiB`` measured 1.8 GiB that way; capping arenas at 4 and sending
every allocation of 4 MiB or more to mmap measured 0.9 GiB at the same speed.

Mapping every such block afresh costs page faults, though: each page of each decoded chunk,
read buffer, output chunk and compressed chunk is faulted in and zeroed by the kernel, then
unmapped (1.03 M faults on a 1 GiB reshard with 32 MiB chunks, most of its system time). One
arena, a threshold at glibc's maximum (32 MiB: only whole chunks of that size or more are
mapped) and a trim threshold of 128 MiB (freed memory at the top of the heap stays for the next
block instead of going back to the kernel each time) measured 0.26 M faults and the same peak
RSS (bench/bench_reshard.py, docs/explanation/performance.md). Other C libraries and
platforms: nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): a larger one is
#: refused.
MMAP_THRESHOLD_MAX = 32 << 20
_done = False


def bound_allocator(
    arenas: int = 1,
    mmap_threshold: int = MMAP_THRESHOLD_MAX,
    trim_threshold: int = 128 << 20,
) -> bool:
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
    _done = (
        bool(mallopt(_M_ARENA_MAX, arenas))
        and bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
        and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    )
    return _done
