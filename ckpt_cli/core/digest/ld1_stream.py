"""The ``ld1`` partial of a leaf whose values arrive front to back: slabs of its C-order
stream, one after another (``verify --deep`` and ``digest`` stream a leaf stored as one chunk,
or as chunks cut along its first axis, that way).

``ld1.partial`` of each slab and a ``merge`` into the leaf's partial cost about twenty numpy
calls on small arrays a slab, each holding the GIL: on the 13-core host those calls, not the
hashing, set how many threads hash at once. Here a slab is one call of the compiled kernel
(``ld1_fold.fold_words``) over its whole words; the bytes of a word cut by the slab's end wait
(``carry``) for the next slab. ``partial`` hands the sums and the open word to ``merge`` as
any box's partial, so a leaf may mix streamed slabs and other boxes.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ckpt_cli.core.digest.ld1 import CODE_BITS, Partial, canonical_bytes, merge
from ckpt_cli.core.digest.ld1_fold import MASK, Fragments, fold_words, join_fragments


def run_start(origin: tuple[int, ...], box: tuple[int, ...], shape: tuple[int, ...]) -> int | None:
    """The element where a box begins when it is one run of the C-order stream (the axes
    after its last partial axis whole, those before it one long), else None: the one-run case
    of ``ld1_fold.box_runs``, without its numpy calls (it runs once a slab)."""
    if len(origin) != len(shape) or len(box) != len(shape):
        return None
    partial_axes = [d for d in range(len(shape)) if box[d] != shape[d]]
    last = partial_axes[-1] if partial_axes else -1
    if any(box[d] != 1 for d in range(last)):
        return None
    start, stride = 0, 1
    for d in range(len(shape) - 1, -1, -1):
        start += origin[d] * stride
        stride *= shape[d]
    return start


_LITTLE = sys.byteorder == "little"


class Stream:
    """Both sums of the bytes ``[start, offset)`` of a leaf's stream, taken slab after slab
    (``start``, a whole word's first byte: where a chunk job's values begin; 0: the leaf's)."""

    def __init__(self, dtype: str, shape: tuple[int, ...], itemsize: int, start: int = 0) -> None:
        if start % 8:
            raise ValueError(f"a stream starts at a word's first byte, not at byte {start}")
        self.dtype, self.shape, self.itemsize = dtype, tuple(shape), itemsize
        self.nbytes = math.prod(shape) * itemsize
        self.start = start
        self.offset = start  # the next byte to take
        self.l1 = self.l2 = 0
        self.carry = b""  # the bytes of the word the last slab cut
        self.as_is = dtype not in CODE_BITS  # a block's bytes are its digest bytes (if native)

    def add(self, origin: tuple[int, ...], block: Any) -> bool:
        """Take ``block`` (at ``origin``) if it is the run that continues the stream; False
        (nothing taken) otherwise: the caller hashes it as a box."""
        import numpy as np

        start = run_start(origin, block.shape, self.shape)
        if start is None or start * self.itemsize != self.offset:
            return False
        as_is = self.as_is and block.flags.c_contiguous and block.dtype.byteorder in "=|<"
        raw = block.reshape(-1).view(np.uint8) if as_is and _LITTLE else canonical_bytes(block)
        if self.carry:
            need = 8 - len(self.carry)
            if raw.size < need:
                self.carry += raw.tobytes()
                self.offset += raw.size
                return True
            word = np.frombuffer(self.carry + raw[:need].tobytes(), np.uint8)
            self._fold(word, (self.offset - len(self.carry)) // 8)
            raw, self.offset, self.carry = raw[need:], self.offset + need, b""
        whole = raw.size // 8 * 8
        if whole:
            self._fold(raw[:whole], self.offset // 8)
        self.carry = raw[whole:].tobytes()
        self.offset += raw.size
        return True

    @property
    def taken(self) -> int:
        """Bytes taken so far."""
        return self.offset - self.start

    def _fold(self, raw: Any, u0: int) -> None:
        s1, s2 = fold_words(raw, u0)
        self.l1, self.l2 = (self.l1 + s1) & MASK, (self.l2 + s2) & MASK

    def partial(self) -> Partial:
        """What the stream holds as a partial: the sums, and an open last word as a fragment
        (``merge`` folds it once it is whole: the leaf's last word may be short)."""
        import numpy as np

        frags: Fragments = join_fragments([])
        if self.carry:
            u = (self.offset - len(self.carry)) // 8
            word = int.from_bytes(self.carry, "little")
            mask = (1 << len(self.carry)) - 1
            frags = (
                np.array([u], np.uint64),
                np.array([word], np.uint64),
                np.array([mask], np.uint64),
            )
        whole = Partial(self.dtype, self.shape, self.nbytes, self.l1, self.l2, self.taken, frags)
        return merge([whole])
