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

from ckpt_cli.core.trend.kernel import Stats, block_stats


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
        number of units and the block's slice of them (2-D and up). The compiled kernel when
        it reads the blocks (``kernel.block_stats``), else numpy: the same figures."""
        import numpy as np

        a = np.asarray(x)
        alive = None
        if units is not None:
            if self.alive is None:
                self.alive = np.zeros(units[0], dtype=bool)
            alive = self.alive[units[1]]
        p = None if prev is None else np.asarray(prev)
        stats = block_stats(a, p, alive)
        if stats is None:
            stats = stats_numpy(a, p, alive)
        zeros, nonfinite, total, squares, max_abs, update = stats
        self.size += a.size
        self.zeros += zeros
        self.nonfinite += nonfinite
        self.finite += a.size - nonfinite
        self.total += total
        self.squares += squares
        self.max_abs = max(self.max_abs, max_abs)
        self.update += update

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


def stats_numpy(a: Any, prev: Any = None, alive: Any = None) -> Stats:
    """``kernel.block_stats`` in numpy (any dtype), in float64."""
    import numpy as np

    if alive is not None:
        cols = a.reshape(-1, a.shape[-1]) if a.size else np.zeros((0, a.shape[-1]), a.dtype)
        alive |= (cols != 0).any(axis=0)
    flat = _float64(a).reshape(-1)
    zeros = int(flat.size - np.count_nonzero(flat))
    if flat.size and np.isfinite(flat.min()) and np.isfinite(flat.max()):
        values = flat  # min and max propagate NaN and Inf: all finite, no mask needed
    else:
        values = flat[np.isfinite(flat)]
    total = squares = max_abs = update = 0.0
    if values.size:
        total = float(values.sum())
        squares = float(np.dot(values, values))
        max_abs = max(0.0, float(values.max()), -float(values.min()))
    if prev is not None:
        with np.errstate(invalid="ignore", over="ignore"):  # Inf - Inf: NaN, left out below
            d = flat - _float64(prev).reshape(-1)
        if d.size and not (np.isfinite(d.min()) and np.isfinite(d.max())):
            d = d[np.isfinite(d)]
        update = float(np.dot(d, d))
    return zeros, flat.size - values.size, total, squares, max_abs, update


def _float64(x: Any) -> Any:
    import numpy as np

    a = np.asarray(x)
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    return a.astype(np.float64, copy=False)
