"""Sub-chunk blocks: every element once, in chunk order, none over the budget."""

from __future__ import annotations

import math

import pytest

from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.blocks import cache_bytes, is_large, stream_blocks


@pytest.mark.parametrize(
    ("shape", "chunk", "budget"),
    [
        ((65536, 1024), (65536, 1024), 4 << 20),  # one 256 MiB chunk
        ((1000, 300), (400, 300), 64 << 10),  # partial last chunk
        ((8, 6, 5), (4, 6, 5), 100),  # 3-d, budget below one row
        ((64, 10), (64, 10), 1 << 20),  # small: merged as before
        ((7,), (7,), 8),
    ],
)
def test_blocks_cover_each_element_once(
    shape: tuple[int, ...], chunk: tuple[int, ...], budget: int
) -> None:
    info = ArrayInfo("float32", shape, chunk, 2, "zstd")
    blocks = list(stream_blocks(info, budget))
    assert blocks
    seen = sum(math.prod(s.stop - s.start for s in b) for b in blocks)
    assert seen == math.prod(shape)
    rows = 4 * math.prod(shape[1:]) if len(shape) > 1 else 4
    if is_large(info, budget):
        for b in blocks:
            nbytes = 4 * math.prod(s.stop - s.start for s in b)
            assert nbytes <= max(budget, 4)
            # Each block lies inside one chunk: the cache serves it from one decoded chunk.
            for s, c in zip(b, chunk, strict=True):
                assert s.start // c == (s.stop - 1) // c
        assert cache_bytes([info], budget) >= 4 * math.prod(
            min(c, s) for c, s in zip(chunk, shape, strict=True)
        )
    else:
        assert cache_bytes([info], budget) == 0
    assert rows  # the geometry under test is not empty
