"""Per-leaf value statistics (``inspect --stats``) computed block by block, with memory bounded
by the block budget.

Blocks are whole chunks (or runs of whole chunks along the last dimensions), so every stored chunk
is decoded once. Means and variances are merged with Chan's parallel formula in float64, which
stays accurate over billions of elements where a running sum of squares would not.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, cached_context
from ckpt_cli.core.format.blocks import (
    DEFAULT_BLOCK_BYTES,
    cache_bytes,
    iter_blocks,
    stream_blocks,
)
from ckpt_cli.core.format.tiers import partial_leaf_refusal
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.errors import StorageError

IN_FLIGHT = 4


class StatsJSON(TypedDict):
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    finite: int


@dataclass(frozen=True)
class LeafStats:
    count: int  # finite values
    nan: int
    inf: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None

    def to_json(self) -> StatsJSON:
        return {
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "std": self.std,
            "nan": self.nan,
            "inf": self.inf,
            "finite": self.count,
        }


class _Acc:
    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.nan = 0
        self.inf = 0

    def add(self, block: Any) -> None:
        import numpy as np

        x = np.asarray(block)
        if x.dtype == np.bool_:
            x = x.astype(np.uint8)
        if x.dtype.kind == "V" or (x.dtype.kind == "f" and x.dtype.itemsize < 4):
            # ml_dtypes (bfloat16, float8, int4) and float16: widen so numpy reduces them exactly.
            x = x.astype(np.float32)
        if x.dtype.kind == "f":
            finite = np.isfinite(x)
            nan = int(np.isnan(x).sum())
            self.nan += nan
            self.inf += int(x.size - finite.sum()) - nan
            x = x[finite]
        if x.size == 0:
            return
        xf = x.astype(np.float64, copy=False).ravel()
        n_b = xf.size
        mean_b = float(xf.mean())
        m2_b = float(((xf - mean_b) ** 2).sum())
        self.lo = min(self.lo, float(xf.min()))
        self.hi = max(self.hi, float(xf.max()))
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * self.n * n_b / n
        self.n = n

    def result(self) -> LeafStats:
        if self.n == 0:
            return LeafStats(0, self.nan, self.inf, None, None, None, None)
        return LeafStats(
            self.n, self.nan, self.inf, self.lo, self.hi, self.mean, math.sqrt(self.m2 / self.n)
        )


def blocks_stats(blocks: Iterable[Any]) -> LeafStats:
    """Min, max, mean, std and NaN/Inf counts of the values of ``blocks`` (numpy arrays: one
    tensor's pieces, in any order), merged as they come."""
    acc = _Acc()
    for block in blocks:
        acc.add(block)
    return acc.result()


def leaf_stats(
    store: ItemStore,
    name: str,
    info: ArrayInfo,
    database: str = "",
    budget: int = DEFAULT_BLOCK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
) -> LeafStats:
    """Min, max, mean, std and NaN/Inf counts of one array, reading at most ``IN_FLIGHT`` blocks."""
    reader = store.reader(name, info, database)
    acc = _Acc()
    pending: deque[tuple[Any, int]] = deque()
    # Whole chunks merged under the budget, or a larger chunk in slabs (decoded once through
    # the store's chunk cache, see ``leaves_stats``).
    blocks = (
        stream_blocks(info, budget)
        if reader.multi_chunk_blocks
        else iter_blocks(info, info.chunk_shape)
    )

    def drain_one() -> None:
        fut, nbytes = pending.popleft()
        try:
            acc.add(fut.result())
        except Exception as e:
            # One host's local tier of Orbax's emergency checkpointing: not damage, refused.
            if (refusal := partial_leaf_refusal(store.item, name)) is not None:
                raise refusal from None
            raise StorageError(
                f"cannot read leaf {name!r}: {str(e).splitlines()[0]}",
                hint="run `ckpt verify` on it",
            ) from None
        if on_bytes:
            on_bytes(nbytes)

    for sl in blocks:
        nbytes = math.prod(s.stop - s.start for s in sl) * info.itemsize
        pending.append((reader.read(sl), nbytes))
        if len(pending) >= IN_FLIGHT:
            drain_one()
    while pending:
        drain_one()
    return acc.result()


def leaves_stats(
    store: ItemStore,
    arrays: Sequence[tuple[str, ArrayInfo, str]],
    on_progress: ProgressFn | None = None,
) -> dict[str, LeafStats]:
    """Statistics of every (name, array, database) of an item, in order; progress as ``stats``
    bytes of all of them."""
    bytes_done = ByteProgress(on_progress, "stats", sum(info.nbytes for _, info, _ in arrays))
    cache = cache_bytes((info for _, info, _ in arrays), DEFAULT_BLOCK_BYTES)
    if cache:  # a chunk larger than a block: a cache that holds it, so it is decoded once
        store = ItemStore(store.item, store.use_zarr3, cached_context(cache))
    return {
        name: leaf_stats(store, name, info, database, on_bytes=bytes_done)
        for name, info, database in arrays
    }
