"""Blocks smaller than a chunk, for reads whose memory and progress must not follow chunk size.

A leaf saved from one device is one chunk (a 512 MiB embedding, one zstd frame): a chunk-aligned
block is then the whole leaf, held at once and reported at once. TensorStore decodes a chunk
whole whatever region is read, but keeps decoded chunks in its cache pool, so reading such a
chunk in slabs through a context whose cache holds it decodes it once and serves the slabs from
the cache: memory is one decoded chunk (the format's floor) plus the slabs, and progress moves
slab by slab. ``stream_blocks`` visits chunk after chunk, each in C-order slabs; chunks smaller
than the budget are merged into blocks as before (``block_shape``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator

from ckpt_cli.core.arrays import ArrayInfo
from ckpt_cli.core.digests import c_order_block
from ckpt_cli.core.stats import block_shape, iter_blocks

Block = tuple[slice, ...]


def decode_shape(info: ArrayInfo) -> tuple[int, ...]:
    """The unit TensorStore decodes: a zarr3 shard's inner chunk, else the chunk."""
    return info.inner_chunk_shape or info.chunk_shape


def decoded_chunk_bytes(info: ArrayInfo) -> int:
    shape = decode_shape(info)
    return math.prod(min(c, s) for c, s in zip(shape, info.shape, strict=True)) * info.itemsize


def is_large(info: ArrayInfo, budget: int) -> bool:
    """Whether one decoded chunk of this leaf exceeds the block budget."""
    return bool(info.shape) and decoded_chunk_bytes(info) > budget


def stream_blocks(info: ArrayInfo, budget: int) -> Iterator[Block]:
    """Every block of the leaf, none (much) over ``budget`` bytes, chunk after chunk."""
    if not is_large(info, budget):
        yield from iter_blocks(info, block_shape(info, budget))
        return
    unit = decode_shape(info)
    grid = [range(0, s, c) for s, c in zip(info.shape, unit, strict=True)]
    for starts in itertools.product(*grid):
        region = tuple(
            slice(a, min(a + c, s)) for a, c, s in zip(starts, unit, info.shape, strict=True)
        )
        shape = tuple(r.stop - r.start for r in region)
        local = dataclasses.replace(info, shape=shape, chunk_shape=shape, inner_chunk_shape=None)
        slab = c_order_block(local, budget, row_cap=0)
        for sl in iter_blocks(local, slab):
            yield tuple(
                slice(r.start + s.start, r.start + s.stop) for r, s in zip(region, sl, strict=True)
            )


def cache_bytes(infos: Iterable[ArrayInfo], budget: int) -> int:
    """Chunk cache that lets ``stream_blocks`` decode each large chunk once: two of the largest
    (the one being read and the next, whose reads start while the last slabs are consumed)."""
    largest = max((decoded_chunk_bytes(i) for i in infos if is_large(i, budget)), default=0)
    return 2 * largest
