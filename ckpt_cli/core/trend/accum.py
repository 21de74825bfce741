"""Statistics of one leaf at one step, merged block by block (and across workers) in float64.

Every figure but ``nonfinite`` and ``zeros`` is over the finite values; ``update`` sums the
squared difference to the previous step over the elements finite at both steps. For a leaf of
two or more dimensions, ``alive`` marks its units (the last axis: a Dense kernel's outputs)
holding any value that is not 0 (NaN counts as not 0); blocks merge by OR-ing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Acc:
    size: int = 0  # elements seen
    finite: int = 0
    zeros: int = 0
    nonfinite: int = 0
    total: float = 0.0  # sum of the finite values
    squares: float = 0.0  # sum of their squares
    max_abs: float = 0.0
    update: float = 0.0  # sum of (x - prev)^2 where both are finite
    alive: Any = None  # numpy bool per unit (2-D and up), None for fewer dimensions

    def add(self, x: Any, prev: Any = None, units: tuple[int, slice] | None = None) -> None:
        """Fold one block (and the same block of the previous step) in; ``units``: the leaf's
        number of units and the block's slice of them (2-D and up)."""
        import numpy as np

        if units is not None:
            a = np.asarray(x)
            if self.alive is None:
                self.alive = np.zeros(units[0], dtype=bool)
            cols = a.reshape(-1, a.shape[-1]) if a.size else np.zeros((0, a.shape[-1]), a.dtype)
            self.alive[units[1]] |= (cols != 0).any(axis=0)
        x = _float64(x)
        flat = x.reshape(-1)
        self.size += flat.size
        self.zeros += int(flat.size - np.count_nonzero(flat))
        if flat.size and np.isfinite(flat.min()) and np.isfinite(flat.max()):
            values = flat  # min and max propagate NaN and Inf: all finite, no mask needed
        else:
            values = flat[np.isfinite(flat)]
            self.nonfinite += flat.size - values.size
        n = values.size
        self.finite += n
        if n:
            self.total += float(values.sum())
            self.squares += float(np.dot(values, values))
            self.max_abs = max(self.max_abs, float(values.max()), -float(values.min()))
        if prev is not None:
            d = flat - _float64(prev).reshape(-1)
            if d.size and not (np.isfinite(d.min()) and np.isfinite(d.max())):
                d = d[np.isfinite(d)]
            self.update += float(np.dot(d, d))

    def merge(self, other: Acc) -> Acc:
        """Both accumulators as one (blocks read by different workers)."""
        return Acc(
            self.size + other.size,
            self.finite + other.finite,
            self.zeros + other.zeros,
            self.nonfinite + other.nonfinite,
            self.total + other.total,
            self.squares + other.squares,
            max(self.max_abs, other.max_abs),
            self.update + other.update,
            _or(self.alive, other.alive),
        )

    @property
    def norm(self) -> float:
        return math.sqrt(self.squares)

    @property
    def rms(self) -> float | None:
        return math.sqrt(self.squares / self.finite) if self.finite else None

    @property
    def mean(self) -> float | None:
        return self.total / self.finite if self.finite else None

    @property
    def zero_fraction(self) -> float:
        return self.zeros / self.size if self.size else 0.0

    @property
    def update_norm(self) -> float:
        """||x - prev|| of the blocks added with a previous step's."""
        return math.sqrt(self.update)


def _or(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    return a | b


def _float64(x: Any) -> Any:
    import numpy as np

    a = np.asarray(x)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return a.astype(np.float64, copy=False)
