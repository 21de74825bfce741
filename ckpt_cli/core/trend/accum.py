"""Statistics of one leaf at one step, merged block by block (and across workers) in float64.

The sums (of the values, their squares, the squared updates) are exact across blocks: each is
kept as Shewchuk's non-overlapping partials (what ``math.fsum`` keeps) and rounded once when
read, so the figures do not depend on the order blocks merge in: one process or many workers,
any split into units, give the same bits. Within a block the kernel (or numpy) sums in float64.

Every figure but ``nonfinite`` and ``zeros`` is over the finite values; ``update`` sums the
squared difference to the previous step over the elements finite at both steps. For a leaf of
two or more dimensions, ``alive`` marks its units (the last axis: a Dense kernel's outputs)
holding any value that is not 0 (NaN counts as not 0); blocks merge by OR-ing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ckpt_cli.core.trend.kernel import Stats, block_stats


@dataclass
class Acc:
    size: int = 0  # elements seen
    finite: int = 0
    zeros: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    alive: Any = None  # numpy bool per unit (2-D and up), None for fewer dimensions
    #: The exact sums' partials: of the finite values, of their squares, of (x - prev)^2 where
    #: both are finite (``total``, ``squares``, ``update`` round them).
    sums: tuple[list[float], list[float], list[float]] = field(default_factory=lambda: ([], [], []))

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
        self.max_abs = max(self.max_abs, max_abs)
        for partials, value in zip(self.sums, (total, squares, update), strict=True):
            _grow(partials, value)

    def merge(self, other: Acc) -> Acc:
        """Both accumulators as one (blocks read by different workers): exact, so any order of
        merging gives the same figures."""
        sums = ([*self.sums[0]], [*self.sums[1]], [*self.sums[2]])
        for partials, more in zip(sums, other.sums, strict=True):
            for value in more:
                _grow(partials, value)
        return Acc(
            self.size + other.size,
            self.finite + other.finite,
            self.zeros + other.zeros,
            self.nonfinite + other.nonfinite,
            max(self.max_abs, other.max_abs),
            _or(self.alive, other.alive),
            sums,
        )

    def again(self) -> Acc:
        """The figures of the same values at the next step (a step not read: its recorded
        digest is this one's), with no update."""
        alive = None if self.alive is None else self.alive.copy()
        sums: tuple[list[float], list[float], list[float]] = ([*self.sums[0]], [*self.sums[1]], [])
        return Acc(self.size, self.finite, self.zeros, self.nonfinite, self.max_abs, alive, sums)

    @property
    def total(self) -> float:
        """The sum of the finite values."""
        return _round(self.sums[0])

    @property
    def squares(self) -> float:
        """The sum of their squares."""
        return _round(self.sums[1])

    @property
    def update(self) -> float:
        """The sum of (x - prev)^2 over the elements finite at both steps."""
        return _round(self.sums[2])

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


def _grow(partials: list[float], x: float) -> None:
    """Add ``x`` to the exact sum held as non-overlapping ``partials`` (Shewchuk's algorithm,
    as ``math.fsum``). An overflow or a value that is not finite leaves one partial: the sum
    is then Inf or NaN whatever the order, as float64 sums are."""
    if not math.isfinite(x) or (partials and not math.isfinite(partials[-1])):
        partials[:] = [sum(partials) + x]
        return
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        if not math.isfinite(hi):
            partials[:] = [hi]
            return
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def _round(partials: list[float]) -> float:
    """The exact sum of ``partials``, rounded once."""
    try:
        return math.fsum(partials)
    except (OverflowError, ValueError):  # Inf and -Inf, or an overflow: what float64 gives
        return sum(partials)


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
