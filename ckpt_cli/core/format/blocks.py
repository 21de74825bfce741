"""Block geometry: how an array is cut into chunk-aligned blocks for reading and writing.

A block is whole chunks (several along the last dimensions while under a byte budget), so every
stored chunk is decoded once; ``aligned_block`` lines blocks up with two chunkings at once (a
copy from one chunking into another).

Blocks smaller than a chunk (``stream_blocks``), for reads whose memory and progress must not
follow the chunk size. A leaf saved from one device is one chunk (a 512 MiB embedding, one zstd frame): a chunk-aligned
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

from ckpt_cli.core.format.arrays import ArrayInfo

DEFAULT_BLOCK_BYTES = 32 << 20


def block_shape(info: ArrayInfo, budget: int = DEFAULT_BLOCK_BYTES) -> tuple[int, ...]:
    """Chunk-aligned block: whole chunks merged along the last dims while under ``budget``."""
    # A chunk dimension of 0 (a zero-size array's header) counts as 1: there is nothing to read.
    shape = [max(1, c) for c in info.chunk_shape]
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


Block = tuple[slice, ...]


def decode_shape(info: ArrayInfo) -> tuple[int, ...]:
    """The unit TensorStore decodes: a zarr3 shard's inner chunk, else the chunk."""
    return info.decode_shape


def decoded_chunk_bytes(info: ArrayInfo) -> int:
    return info.decoded_chunk_bytes


def is_large(info: ArrayInfo, budget: int) -> bool:
    """Whether one decoded chunk of this leaf exceeds the block budget."""
    return bool(info.shape) and decoded_chunk_bytes(info) > budget


def streams(info: ArrayInfo, budget: int) -> bool:
    """Whether a whole pass of the leaf may stream its chunks from their files (``scan``):
    each chunk fills a block of ``budget`` at least, so TensorStore, which would read it as
    that one block, has no small chunks to batch. (2 cores, ``verify --deep --threads 2`` of
    512 MiB in bfloat16 chunks of exactly verify's 4 MiB: 0.58-0.65 s, 134-144 MiB read through
    TensorStore; 0.47-0.48 s, 91 MiB streamed.)"""
    return bool(info.shape) and decoded_chunk_bytes(info) >= budget


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
        for sl in iter_blocks(local, _slab(shape, info.itemsize, budget)):
            yield tuple(
                slice(r.start + s.start, r.start + s.stop) for r, s in zip(region, sl, strict=True)
            )


def region_slabs(region: Block, itemsize: int, budget: int) -> list[Block]:
    """``region`` cut into C-order slabs of at most ``budget`` bytes (one row of the cut
    dimension at least), in order: a block larger than the budget read or written piecewise."""
    shape = tuple(r.stop - r.start for r in region)
    slab = _slab(shape, itemsize, budget)
    ranges = [range(0, n, b) for n, b in zip(shape, slab, strict=True)]
    return [
        tuple(
            slice(r.start + st, r.start + min(st + b, n))
            for r, st, b, n in zip(region, starts, slab, shape, strict=True)
        )
        for starts in itertools.product(*ranges)
    ]


def _slab(shape: tuple[int, ...], itemsize: int, budget: int) -> tuple[int, ...]:
    """A C-order slab of ``shape`` under ``budget``: leading dims 1, one dim cut, the rest whole."""
    k = len(shape) - 1
    for d in range(len(shape)):
        if math.prod(shape[d + 1 :]) * itemsize <= budget:
            k = d
            break
    inner = math.prod(shape[k + 1 :]) * itemsize
    rows = max(1, min(shape[k], budget // max(1, inner)))
    return (1,) * k + (rows,) + tuple(shape[k + 1 :])


def cache_bytes(infos: Iterable[ArrayInfo], budget: int) -> int:
    """Chunk cache that lets ``stream_blocks`` decode each large chunk once: two of the largest
    (the one being read and the next, whose reads start while the last slabs are consumed)."""
    largest = max((decoded_chunk_bytes(i) for i in infos if is_large(i, budget)), default=0)
    return 2 * largest
