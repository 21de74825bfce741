"""A block's statistics in compiled code (``ckpt_trend_stats`` in ``ckpt_cli/_kernels.c``).

numpy takes a block's figures in about ten passes over a float64 copy of it (the conversion,
min and max to find NaN and Inf, the sum, the squares, the difference to the previous step and
its squares, the units' flags), each pass giving the GIL up and taking it back. The C loop reads
the block as stored (float32, bfloat16, float16 or float64), once, and sums in float64 (in lanes
over strips, the strips' sums compensated: as close to the exact sums as numpy's pairwise
float64 sums, or closer), with no GIL held: threads count at once. Any other dtype, a byte
order not the machine's, an array that is not contiguous, or no kernel (``core/kernels.py``):
``block_stats`` returns None and ``accum`` runs numpy (tests/core/trend/test_kernel.py: the
same counts and maxima, sums within 1e-12).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ckpt_cli.core.kernels import function

#: The kernel's codes of the dtypes it reads.
KINDS = {"float32": 0, "float64": 1, "bfloat16": 2, "float16": 3}

#: (zeros, nonfinite, sum, sum of squares, max |x|, sum of squared updates)
Stats = tuple[int, int, float, float, float, float]


@functools.cache
def _stats_fn() -> Any:
    p, n = ctypes.c_void_p, ctypes.c_size_t
    return function("ckpt_trend_stats", [p, p, n, ctypes.c_int, p, n, p, p, ctypes.c_int])


def available() -> bool:
    """Whether the compiled statistics are in use."""
    return _stats_fn() is not None


def _readable(a: Any) -> bool:
    return a.dtype.name in KINDS and a.dtype.isnative and a.flags.c_contiguous


def block_stats(
    x: Any, prev: Any = None, alive: Any = None, *, narrow: bool = False
) -> Stats | None:
    """The figures of block ``x`` (and of its update from ``prev``, the same block of the step
    before, when given), OR-ing into ``alive`` (a contiguous bool view, one per value of the
    last axis) whether each unit holds any value that is not 0; None: use numpy. ``narrow``:
    the kernel's two-lane loop even where AVX2 gives it four (the tests run both)."""
    import numpy as np

    fn = _stats_fn()
    if fn is None or not _readable(x):
        return None
    if prev is not None and (prev.dtype != x.dtype or prev.shape != x.shape or not _readable(prev)):
        return None
    width = 0
    if alive is not None:
        width = x.shape[-1] if x.ndim else 1
        if alive.dtype != np.bool_ or alive.shape != (width,) or not alive.flags.c_contiguous:
            return None
    out = np.zeros(4, np.float64)
    counts = np.zeros(2, np.int64)
    fn(
        x.ctypes.data,
        None if prev is None else prev.ctypes.data,
        x.size,
        KINDS[x.dtype.name],
        None if alive is None else alive.ctypes.data,
        width,
        out.ctypes.data,
        counts.ctypes.data,
        int(narrow),
    )
    return int(counts[0]), int(counts[1]), *(float(v) for v in out)  # type: ignore[return-value]
