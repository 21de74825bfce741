"""Contiguous blocks: the pieces a tensor is streamed in, to and from a safetensors file.

A safetensors tensor is one C-order run of bytes, so the pieces that can be written or read with
one positioned I/O are C-contiguous slabs: fixed indices on the first ``k`` axes, a range on axis
``k``, every later axis whole. Usually ``k`` is 0 and a block is a range of rows; a row larger
than the memory budget is cut along the next axes, so memory never depends on the tensor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

Block = tuple[tuple[int, ...], tuple[int, ...]]  # (start corner, shape)


def contiguous_blocks(
    shape: Sequence[int],
    itemsize: int,
    max_bytes: int,
    chunks: Sequence[int] | None = None,
) -> Iterator[Block]:
    """C-order contiguous blocks covering ``shape``, each at most ``max_bytes`` (or one element),
    in file order. ``chunks``: the source's chunk shape; block lengths along the cut axis are
    multiples of its extent there where possible, so each read covers whole chunks."""
    shape = tuple(shape)
    if not shape:
        yield (), ()
        return
    if math.prod(shape) == 0:
        return
    k = 0
    while k < len(shape) - 1 and math.prod(shape[k + 1 :]) * itemsize > max_bytes:
        k += 1
    step_bytes = math.prod(shape[k + 1 :]) * itemsize
    m = max(1, max_bytes // step_bytes)
    align = chunks[k] if chunks is not None and len(chunks) == len(shape) else 1
    if align > 1 and m >= align:
        m -= m % align
    rest = shape[k + 1 :]
    for prefix in itertools.product(*(range(d) for d in shape[:k])):
        for start in range(0, shape[k], m):
            n = min(m, shape[k] - start)
            yield (*prefix, start, *(0,) * len(rest)), (*(1,) * k, n, *rest)


def flat_offset(shape: Sequence[int], start: Sequence[int]) -> int:
    """The C-order element index of ``start`` in an array of ``shape``."""
    offset = 0
    for d, s in zip(shape, start, strict=True):
        offset = offset * d + s
    return offset


def check_contiguous(shape: Sequence[int], start: Sequence[int], block: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``block`` at ``start`` is one C-order run inside ``shape``."""
    if len(start) != len(shape) or len(block) != len(shape):
        raise ValueError(f"block {list(block)} at {list(start)} does not match rank {len(shape)}")
    for d, s, b in zip(shape, start, block, strict=True):
        if s < 0 or b < 0 or s + b > d:
            raise ValueError(f"block {list(block)} at {list(start)} is outside {list(shape)}")
    # Past the cut axis every axis is whole; before it every extent is 1.
    k = next((i for i, b in enumerate(block) if b != 1), len(block))
    for i in range(k + 1, len(shape)):
        if start[i] != 0 or block[i] != shape[i]:
            raise ValueError(
                f"block {list(block)} at {list(start)} of {list(shape)} is not C-contiguous"
            )
