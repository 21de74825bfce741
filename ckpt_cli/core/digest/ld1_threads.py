"""The ``ld1`` partial of one large block, hashed in ranges on this process's threads.

``ld1`` is a sum over positions (``ld1.py``), so the partials of the parts of a box merge
into the box's partial whatever the cuts. A block is cut along its first axis longer than one
into ``pieces`` sub-boxes (rows of unequal counts; a cut may fall inside a 64-bit word, whose
bytes ``merge`` joins), each hashed on the hashing pool (``threads.hash_pool``): numpy releases
the GIL in the ufuncs and reductions ``ld1`` spends its time in, so the parts run at once.
A part is at least ``MIN_PIECE_BYTES``: below that the numpy calls' overhead wins.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from ckpt_cli.core.digest.ld1 import Partial, merge, partial

#: Bytes of the smallest part worth a thread of its own.
MIN_PIECE_BYTES = 8 << 20
_POOL_PREFIX = "ckpt-hash"


def cut_box(
    origin: tuple[int, ...], box: tuple[int, ...], pieces: int
) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """``pieces`` (or fewer) sub-boxes of the box at ``origin``: (their origin in the leaf,
    their slice of the block), cut along the first axis longer than one."""
    axis = next((d for d, n in enumerate(box) if n > 1), None)
    if axis is None or pieces <= 1:
        return [(origin, tuple(slice(0, n) for n in box))]
    n = box[axis]
    pieces = min(pieces, n)
    cuts = [n * i // pieces for i in range(pieces + 1)]
    out = []
    for a, b in itertools.pairwise(cuts):
        sl = tuple(slice(a, b) if d == axis else slice(0, m) for d, m in enumerate(box))
        o = tuple(x + a if d == axis else x for d, x in enumerate(origin))
        out.append((o, sl))
    return out


def pieces_for(nbytes: int, threads: int) -> int:
    """Parts a block of ``nbytes`` is hashed in on ``threads`` threads."""
    return max(1, min(threads, nbytes // MIN_PIECE_BYTES))


def partial_threaded(
    origin: tuple[int, ...],
    block: Any,
    shape: tuple[int, ...],
    dtype: str | None = None,
    threads: int | None = None,
) -> Partial:
    """``ld1.partial`` of ``block`` at ``origin``, its parts hashed at once on the
    hashing pool; the same value as ``partial`` (a test checks it for many cuts)."""
    import numpy as np

    from ckpt_cli.core import threads as _threads

    block = np.asarray(block)
    n = _threads.threads() if threads is None else threads
    k = pieces_for(block.nbytes, n)
    if k <= 1 or threading.current_thread().name.startswith(_POOL_PREFIX):
        return partial(origin, block, shape, dtype)  # on the pool already: never wait on it
    parts = cut_box(origin, block.shape, k)
    pool = _threads.hash_pool(n)
    futures = [pool.submit(partial, o, block[sl], shape, dtype) for o, sl in parts]
    return merge([f.result() for f in futures])
