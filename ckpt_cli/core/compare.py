"""The blocks ``diff`` reads of a pair of arrays (``pair_blocks``), and the element-wise
comparison it applies to each pair (``Compare``): ``|a - b| <= atol +
rtol * |b|`` (numpy's ``allclose`` rule), NaN equal to NaN at the same place, integers of one
dtype compared exactly, equal bits skipped; complex values as complex128 (both parts count,
the distance is ``|a - b|``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.blocks import block_shape, is_large, iter_blocks, stream_blocks


def pair_blocks(a: ArrayInfo, b: ArrayInfo, budget: int) -> Any:
    """Blocks of at most ``budget`` bytes: slabs of A's chunks when one exceeds the budget,
    else whole chunks aligned to both chunkings when their common multiple stays small, else
    to A's."""
    if is_large(a, budget):
        return stream_blocks(a, budget)
    lcm = tuple(
        min(s, math.lcm(ca or 1, cb or 1))
        for s, ca, cb in zip(a.shape, a.chunk_shape, b.chunk_shape, strict=True)
    )
    if math.prod(lcm) * max(a.itemsize, b.itemsize) <= 4 * budget:
        return iter_blocks(a, block_shape(replace(a, chunk_shape=lcm), budget))
    return iter_blocks(a, block_shape(a, budget))


class Compare:
    """Running totals of one pair of arrays compared block by block: elements outside the
    tolerance, the largest absolute and relative difference."""

    def __init__(self, atol: float, rtol: float, exact_ints: bool) -> None:
        self.atol = atol
        self.rtol = rtol
        self.exact_ints = exact_ints
        self.mismatched = 0
        self.max_abs = 0.0
        self.max_rel = 0.0

    def add(self, a: Any, b: Any) -> None:
        import numpy as np

        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == b.dtype and a.dtype.itemsize in (1, 2, 4, 8) and a.shape == b.shape:
            # Equal bits are equal values (the same NaN too): most blocks of most diffs are
            # unchanged, and one integer comparison costs far less than the float64 pass.
            bits = f"u{a.dtype.itemsize}"
            if np.array_equal(a.view(bits), b.view(bits)):
                return
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
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.where(same, 0.0, np.abs(af - bf))
            if not exact:
                ok = same | (diff <= self.atol + self.rtol * np.abs(bf))
                self.mismatched += int(np.count_nonzero(~ok))
            if not diff.size:
                return
            bad = ~np.isfinite(diff)  # NaN against a number, Inf against a finite value
            self.max_abs = max(self.max_abs, math.inf if bad.any() else float(diff.max()))
            rel = ~bad & (bf != 0)
            if rel.any():
                self.max_rel = max(self.max_rel, float((diff[rel] / np.abs(bf[rel])).max()))


def _same(a: Any, b: Any) -> Any:
    import numpy as np

    return (a == b) | (np.isnan(a) & np.isnan(b))
