"""Block geometry: how an array is cut into chunk-aligned blocks for reading and writing.

A block is whole chunks (several along the last dimensions while under a byte budget), so every
stored chunk is decoded once; ``aligned_block`` lines blocks up with two chunkings at once (a
copy from one chunking into another).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

from ckpt_cli.core.format.arrays import ArrayInfo

DEFAULT_BLOCK_BYTES = 32 << 20


def block_shape(info: ArrayInfo, budget: int = DEFAULT_BLOCK_BYTES) -> tuple[int, ...]:
    """Chunk-aligned block: whole chunks merged along the last dims while under ``budget``."""
    shape = list(info.chunk_shape) or []
    for d in range(len(shape) - 1, -1, -1):
        other = math.prod(shape[:d] + shape[d + 1 :]) * info.itemsize
        fit = max(shape[d], (budget // max(1, other)) // shape[d] * shape[d])
        shape[d] = min(info.shape[d], fit)
        if shape[d] < info.shape[d]:
            break
    return tuple(shape)


def iter_blocks(info: ArrayInfo, block: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    ranges = [range(0, s, b) if s else range(0) for s, b in zip(info.shape, block, strict=True)]
    for starts in itertools.product(*ranges):
        yield tuple(
            slice(st, min(st + b, s)) for st, b, s in zip(starts, block, info.shape, strict=True)
        )


def aligned_block(
    info: ArrayInfo, source_chunks: tuple[int, ...] | None, budget: int
) -> tuple[int, ...]:
    """Output blocks made of whole output chunks; when a block of whole source chunks too (the
    per-dimension least common multiple) fits twice the budget, blocks are made of those."""
    if source_chunks is not None and len(source_chunks) == len(info.shape):
        unit = tuple(
            min(n, math.lcm(c, s)) if c and s else n
            for n, c, s in zip(info.shape, info.chunk_shape, source_chunks, strict=True)
        )
        if math.prod(unit) * info.itemsize <= 2 * budget:
            return block_shape(dataclasses.replace(info, chunk_shape=unit), budget)
    return block_shape(info, budget)
