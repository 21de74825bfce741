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
    """The C function (its last argument: the path to run, ``PATHS``), or None (not built, not
    loadable, or turned off)."""
    p, n, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    args = [p, n, n, p, p, u64, u64, p, p, ctypes.c_int]
    return function("ckpt_ld1_block_sums", args, ctypes.c_int)


@functools.cache
def _words_fn() -> Any:
    p, n, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    args = [p, n, u64, n, p, p, u64, u64, u64, u64, p, ctypes.c_int]
    return function("ckpt_ld1_words", args, ctypes.c_int)


@functools.cache
def _runs_fn() -> Any:
    p, n, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64
    args = [p, n, p, p, n, n, p, p, u64, u64, u64, u64, p, ctypes.c_int]
    return function("ckpt_ld1_runs", args, ctypes.c_int)


#: The kernel's paths: the one the CPU runs fastest, then each one by name.
PATHS = {"auto": 0, "c": 1, "avx512": 2}


def available() -> bool:
    """Whether the compiled block sums are in use."""
    return _block_sums_fn() is not None


def block_sums(rows: Any, a: Any, c: Any, m1: int, m2: int) -> Any | None:
    """``(2, n)`` uint64: both sums of each row of ``rows`` (n rows of whole blocks of words,
    C-contiguous, any alignment) with the tables ``a`` and ``c``; None: use numpy."""
    if _block_sums_fn() is None or not rows.flags.c_contiguous:
        return None
    width = rows.shape[1]
    if a.shape != (width,) or c.shape != (width,):
        return None
    return block_sums_on(rows, a, c, m1, m2, "auto")[0]


def block_sums_on(rows: Any, a: Any, c: Any, m1: int, m2: int, path: str) -> tuple[Any, str]:
    """``block_sums`` on one path of the kernel (``PATHS``; a path this CPU lacks runs the next
    slower one), and the path taken (the tests compare every path with numpy)."""
    import numpy as np

    fn = _block_sums_fn()
    assert fn is not None and rows.flags.c_contiguous
    n, width = rows.shape
    sums = np.empty((2, n), np.uint64)
    args = (rows.ctypes.data, n, width, a.ctypes.data, c.ctypes.data, m1, m2)
    taken = fn(*args, sums.ctypes.data, sums.ctypes.data + 8 * n, PATHS[path])
    return sums, {v: k for k, v in PATHS.items()}[taken]


def _sums(fn: Any, head: tuple[Any, ...], a: Any, c: Any, keys: tuple[int, ...], path: str) -> Any:
    """Call a weighed-sums kernel: its own leading arguments (``head``), then the tables, the
    keys, the two sums out and the path; the two sums."""
    import numpy as np

    out = np.zeros(2, np.uint64)
    fn(*head, a.size, a.ctypes.data, c.ctypes.data, *keys, out.ctypes.data, PATHS[path])
    return int(out[0]), int(out[1])


def word_sums(
    words: Any, u0: int, a: Any, c: Any, keys: tuple[int, int, int, int], path: str = "auto"
) -> tuple[int, int] | None:
    """Both sums of whole words ``words`` (uint64, contiguous) that are words ``u0, u0+1...``
    of a leaf's stream, each block's sums weighed by its keys (``keys``: m1, m2 and the two
    seeds of the block keys): ``ld1_fold.fold_words`` in one call that holds no GIL. None:
    use numpy."""
    fn = _words_fn()
    if fn is None or not words.flags.c_contiguous:
        return None
    found: tuple[int, int] = _sums(fn, (words.ctypes.data, words.size, u0), a, c, keys, path)
    return found


def run_sums(
    rows: Any,
    sel: Any,
    head: int,
    k: int,
    u0s: Any,
    a: Any,
    c: Any,
    keys: tuple[int, int, int, int],
    path: str = "auto",
) -> tuple[int, int] | None:
    """``word_sums`` of many runs in one call: ``k`` whole words of each row ``sel[r]`` of
    ``rows`` (uint8, each row's bytes contiguous) from byte ``head`` on, words ``u0s[r]...``
    of the stream; the sums of all of them. None: use numpy."""
    import numpy as np

    fn = _runs_fn()
    if fn is None or rows.ndim != 2 or rows.strides[1] != 1 or rows.strides[0] < 0:
        return None
    offsets = np.asarray(sel, np.int64) * np.int64(rows.strides[0]) + np.int64(head)
    u = np.ascontiguousarray(u0s, np.uint64)
    head_args = (rows.ctypes.data, offsets.size, offsets.ctypes.data, u.ctypes.data, k)
    found: tuple[int, int] = _sums(fn, head_args, a, c, keys, path)
    return found
