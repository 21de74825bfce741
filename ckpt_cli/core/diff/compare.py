"""The element-wise comparison of two blocks of a pair of arrays (``Compare``): elements outside
the tolerance, the largest absolute and relative difference, the NaN and Inf of each side; the
tiles and parts a pair of blocks is compared in, so that neither side is read a cache line per
element and the float64 temporaries stay small. ``values.py`` reads the blocks and feeds them in.
"""

from __future__ import annotations

import math
from typing import Any

from ckpt_cli.core.diff import NonFiniteCounts
from ckpt_cli.core.format.blocks import region_slabs


class Compare:
    """Running totals of one pair of arrays compared block by block: elements outside the
    tolerance, the largest absolute and relative difference, the NaN and Inf of each side.

    NaN equals NaN at the same place, and an Inf the same Inf. A difference that is not finite
    (NaN against a number is NaN, Inf against another value Inf) makes ``max_abs`` and
    ``max_rel`` that float: NaN once any is NaN, else Inf; a pair NaN on both sides everywhere
    has no difference to measure (None)."""

    def __init__(self, atol: float, rtol: float, exact_ints: bool) -> None:
        self.atol = atol
        self.rtol = rtol
        self.exact_ints = exact_ints
        self.mismatched = 0
        self.elements = 0
        self._abs = 0.0  # the largest finite |a - b|
        self._rel = 0.0
        self._worst: float | None = None  # NaN or Inf once a difference is one
        self._counts = [0, 0, 0, 0, 0]  # NonFiniteCounts' fields, in order

    @property
    def max_abs(self) -> float | None:
        return self._figure(self._abs)

    @property
    def max_rel(self) -> float | None:
        return self._figure(self._rel)

    def _figure(self, finite: float) -> float | None:
        if self.elements and self._counts[4] == self.elements:
            return None  # NaN on both sides everywhere: nothing to measure
        return finite if self._worst is None else self._worst

    def counts(self) -> NonFiniteCounts:
        return NonFiniteCounts(*self._counts)

    def add(self, a: Any, b: Any) -> None:
        import numpy as np

        a, b = np.asarray(a), np.asarray(b)
        if a.ndim == 0 and b.ndim == 0:
            a, b = a.reshape(1), b.reshape(1)  # so that a tile of them is an array too
        self.elements += a.size
        if a.shape != b.shape or not a.size:
            self._values(a, b)
            return
        # Equal bits are equal values (the same NaN too): most blocks of most diffs are
        # unchanged, and one integer comparison costs far less than the float64 pass.
        same = a.dtype == b.dtype and a.dtype.itemsize in (1, 2, 4, 8)
        bits = f"u{a.dtype.itemsize}" if same else None
        for tile in layout_tiles(a, b):
            x, y = a[tile], b[tile]
            if bits is not None and np.array_equal(x.view(bits), y.view(bits)):
                nan, inf = nonfinite_counts(x)
                self._count(nan, inf, nan, inf, nan)
                continue
            # The float64 temporaries of the value pass stay small whatever the block.
            for part in value_parts(x.shape):
                self._values(x[part], y[part])

    def _count(self, *counts: int) -> None:
        for i, n in enumerate(counts):
            self._counts[i] += n

    def _values(self, a: Any, b: Any) -> None:
        """Fold in one pair of (small) blocks whose bits differ: the float64 pass."""
        import numpy as np

        exact = self.exact_ints and a.dtype.kind in "iub" and not (self.atol or self.rtol)
        if exact:
            # Integers compare in their own dtype: float64 would round int64 beyond 2**53.
            neq = a != b
            self.mismatched += int(np.count_nonzero(neq))
            a, b = a[neq], b[neq]
        if a.dtype.kind == "c" or b.dtype.kind == "c":
            # Complex values differ in their imaginary parts too: compared as complex128, the
            # distance is |a - b|; NaN equals NaN part by part.
            af, bf = a.astype(np.complex128), b.astype(np.complex128)
            same = _same(af.real, bf.real) & _same(af.imag, bf.imag)
        else:
            af, bf = a.astype(np.float64), b.astype(np.float64)
            same = _same(af, bf)
        self._count_pair(af, bf)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.where(same, 0.0, np.abs(af - bf))
            finite = np.isfinite(diff)
            if not exact:
                # An Inf never lies within a tolerance (rtol * |inf| would let any value in).
                ok = same | (finite & (diff <= self.atol + self.rtol * np.abs(bf)))
                self.mismatched += int(np.count_nonzero(~ok))
            if not diff.size:
                return
            self._note_worst(diff, finite)
            self._abs = max(self._abs, float(diff.max(initial=0.0, where=finite)))
            # Equal values have no relative difference: a NaN or Inf on both sides would make
            # 0 / |b| NaN and hide the block's largest relative difference.
            rel = finite & ~same & (bf != 0)
            if rel.any():
                self._rel = max(self._rel, float((diff[rel] / np.abs(bf[rel])).max()))

    def _count_pair(self, af: Any, bf: Any) -> None:
        """The NaN and Inf of both sides of a pair of float64 (complex128) blocks."""
        import numpy as np

        if np.isfinite(af).all() and np.isfinite(bf).all():
            return
        nan_a, nan_b = np.isnan(af), np.isnan(bf)
        self._count(
            int(np.count_nonzero(nan_a)),
            int(np.count_nonzero(np.isinf(af) & ~nan_a)),
            int(np.count_nonzero(nan_b)),
            int(np.count_nonzero(np.isinf(bf) & ~nan_b)),
            int(np.count_nonzero(nan_a & nan_b)),
        )

    def _note_worst(self, diff: Any, finite: Any) -> None:
        """A difference that is not finite: NaN wins over Inf, for good."""
        import numpy as np

        if finite.all() or (self._worst is not None and math.isnan(self._worst)):
            return
        self._worst = math.nan if np.isnan(diff).any() else math.inf


def nonfinite_counts(x: Any) -> tuple[int, int]:
    """NaN and Inf (either sign) values of a block."""
    import numpy as np

    if x.dtype.kind in "iubSUOMm" or not x.size or _all_finite(x):
        return 0, 0
    nan = np.isnan(x)
    return int(np.count_nonzero(nan)), int(np.count_nonzero(np.isinf(x) & ~nan))


#: 2-byte floats, by dtype name: the exponent bits, all ones exactly for NaN and Inf. Read by
#: their bits: numpy's float16 and ml_dtypes' bfloat16 ufuncs are far slower than a mask.
_EXPONENT_BITS = {"float16": 0x7C00, "bfloat16": 0x7F80}


def _all_finite(x: Any) -> bool:
    import numpy as np

    exponent = _EXPONENT_BITS.get(x.dtype.name)
    if exponent is not None:
        return int((x.view(np.uint16) & 0x7FFF).max()) < exponent
    if x.dtype.kind == "f":
        # max and min propagate NaN and reach either Inf, without a temporary the size of the
        # block (0.7 ms over 4M float32 values, isfinite 1.0 ms).
        return bool(np.isfinite(x.max()) and np.isfinite(x.min()))
    try:
        return bool(np.isfinite(x).all())
    except TypeError:  # not numbers (a structured or opaque dtype): nothing to count
        return True


#: Elements of one tile when the two blocks' layouts differ (a transposed view against a C-order
#: block), and its extent along A's contiguous axis: both sides' tiles stay in the CPU's caches.
#: One comparison over a whole 8 MiB float32 block took 7-8 ms, tiles of 512 x 64 2.8-3.0 ms
#: (a [4096, 512] band; tiles of 32 x 1024 or 256 x 128 took 4-10 ms).
LAYOUT_TILE_ELEMENTS = 1 << 15
LAYOUT_TILE_RUN = 512
#: Elements compared at once in the float64 pass (its temporaries: a few MiB at most).
VALUE_PART_ELEMENTS = 1 << 18


def _fast_axis(x: Any) -> int | None:
    """The axis along which ``x``'s elements are adjacent in memory (smallest stride among the
    axes longer than 1); None for fewer than two such axes."""
    axes = [d for d in range(x.ndim) if x.shape[d] > 1]
    if len(axes) < 2:
        return None
    return min(axes, key=lambda d: abs(x.strides[d]))


def layout_tiles(a: Any, b: Any) -> list[tuple[slice, ...]]:
    """Boxes covering two blocks of one shape: the whole block when their elements lie in the
    same order, else tiles of ``LAYOUT_TILE_RUN`` along A's contiguous axis by what fits
    ``LAYOUT_TILE_ELEMENTS`` along B's, so neither side is read a cache line per element."""
    import itertools

    whole = tuple(slice(0, n) for n in a.shape)
    p, q = _fast_axis(a), _fast_axis(b)
    if p is None or q is None or p == q:
        return [whole]
    rest = math.prod(n for d, n in enumerate(a.shape) if d not in (p, q))
    rows = LAYOUT_TILE_RUN
    cols = max(1, LAYOUT_TILE_ELEMENTS // (rows * rest))
    tiles = []
    for i, j in itertools.product(range(0, a.shape[p], rows), range(0, a.shape[q], cols)):
        box = list(whole)
        box[p], box[q] = slice(i, min(i + rows, a.shape[p])), slice(j, min(j + cols, a.shape[q]))
        tiles.append(tuple(box))
    return tiles


def value_parts(shape: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """C-order slabs of ``shape`` of ``VALUE_PART_ELEMENTS`` elements at most (one row of the
    cut axis at least)."""
    if math.prod(shape) <= VALUE_PART_ELEMENTS:
        return [tuple(slice(0, n) for n in shape)]
    return region_slabs(tuple(slice(0, n) for n in shape), 1, VALUE_PART_ELEMENTS)


def _same(a: Any, b: Any) -> Any:
    import numpy as np

    return (a == b) | (np.isnan(a) & np.isnan(b))
