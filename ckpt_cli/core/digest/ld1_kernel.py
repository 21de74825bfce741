"""ld1's block sums in compiled code: ``ckpt_cli/_kernels.c``, built at install (optional).

numpy hashes a span of whole blocks in nine calls over scratch arrays; each call gives the GIL
up and takes it back, and on a many-core host those hand-overs, not the arithmetic, cap all
threads together at about 5 GiB/s (docs/explanation/performance.md). The C loop does the same
arithmetic in one pass over the words, called through ctypes, which holds no GIL during the
call: threads hash at once. Where the library was not built (no compiler at install) or
``CKPT_KERNELS=0`` is set (``core/kernels.py``), ``block_sums`` returns None and the caller
runs numpy: the same bits.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ckpt_cli.core.kernels import function


@functools.cache
def _block_sums_fn() -> Any:
    """The C function, or None (not built, not loadable, or turned off)."""
    p, n, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    return function("ckpt_ld1_block_sums", [p, n, n, p, p, u64, u64, p, p])


@functools.cache
def _block_sums_on_fn() -> Any:
    """The C function that takes the path (plain C, AVX-512) to run, or None."""
    p, n, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    args = [p, n, n, p, p, u64, u64, p, p, ctypes.c_int]
    return function("ckpt_ld1_block_sums_on", args, ctypes.c_int)


#: ``block_sums_on``'s paths: the one the CPU runs fastest, then each one by name.
PATHS = {"auto": 0, "c": 1, "avx512": 2}


def available() -> bool:
    """Whether the compiled block sums are in use."""
    return _block_sums_fn() is not None


def block_sums(rows: Any, a: Any, c: Any, m1: int, m2: int) -> Any | None:
    """``(2, n)`` uint64: both sums of each row of ``rows`` (n rows of whole blocks of words,
    C-contiguous, any alignment) with the tables ``a`` and ``c``; None: use numpy."""
    import numpy as np

    fn = _block_sums_fn()
    if fn is None or not rows.flags.c_contiguous:
        return None
    n, width = rows.shape
    if a.shape != (width,) or c.shape != (width,):
        return None
    sums = np.empty((2, n), np.uint64)
    fn(
        rows.ctypes.data,
        n,
        width,
        a.ctypes.data,
        c.ctypes.data,
        m1,
        m2,
        sums.ctypes.data,
        sums.ctypes.data + 8 * n,
    )
    return sums


def block_sums_on(rows: Any, a: Any, c: Any, m1: int, m2: int, path: str) -> tuple[Any, str]:
    """``block_sums`` on one path of the kernel (``PATHS``; a path this CPU lacks runs the next
    slower one), and the path taken: for the tests, which compare every path with numpy."""
    import numpy as np

    fn = _block_sums_on_fn()
    assert fn is not None and rows.flags.c_contiguous
    n, width = rows.shape
    sums = np.empty((2, n), np.uint64)
    args = (rows.ctypes.data, n, width, a.ctypes.data, c.ctypes.data, m1, m2)
    taken = fn(*args, sums.ctypes.data, sums.ctypes.data + 8 * n, PATHS[path])
    return sums, {v: k for k, v in PATHS.items()}[taken]
