"""``ld1``: a digest of a leaf's values that does not depend on how the leaf is stored or cut.

The specification is docs/reference/digest-spec.md; this module (partials, merge, finish) and
``ld1_fold.py`` (the word sums) are the fast implementation, and
``tests/support/ldigest_reference.py`` the slow one it is checked against. In short: the leaf's
values in C order, little-endian, are one byte stream, read as 64-bit words ``w_u``; word ``u``
(block ``b = u >> 14``, position ``j = u & 16383``) contributes ``z_u = m(w_u + a_j)`` to two
sums mod 2^64: ``L1 += r1_b * z_u`` and ``L2 += r2_b * c_j * z_u``. Sums commute, so any
partition of the array into boxes, hashed by any number of processes, merges in any order to
the same value; dtype, shape and length are folded in by ``finish``.

Why this construction (rather than SHA-256 of the stream, or a Merkle tree over byte ranges):

* A box of a sharded array is not a byte range of the C-order stream; a sum over positions is
  the only shape of hash that a box, a chunk or a host's shard can compute alone.
* ``m`` (two odd multiplies, two xorshifts) is a bijection of 64-bit words and ``r1_b``,
  ``r2_b``, ``c_j`` are odd, so a change confined to one word changes both sums: always
  detected, not just with high probability. Several changed words cancel only if pseudo-random
  differences sum to zero in both lanes (about 2^-64 per lane). It is a checksum against
  accidents (bit rot, a bad copy, a wrong shard), not a MAC: someone who wants a collision can
  make one.
* Words, not elements: numpy then does about ten operations per 8 bytes whatever the dtype
  (bfloat16 costs what float32 costs), fast enough to outrun hashlib's SHA-256 here. The
  price is a word cut by a box edge: each box keeps the bytes of its edge words as
  *fragments* (word index, bytes, mask) that ``merge`` joins into whole words.
* A box of a leaf cut on its last axis is many short runs, evenly spaced in the stream: a
  cache-sized chunk of them takes its ``a_j``/``c_j`` as one strided view of the tables
  repeated (``_fold_strided``: no gather), so it hashes about as fast as whole rows.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ckpt_cli.core.digest.ld1_fold import (
    MASK,
    Fragments,
    box_runs,
    fold_runs,
    fold_sorted,
    full_mask,
    join_fragments,
    splitmix,
)

TAG = "ld1"
ALGORITHM = "ld1: additive 2x64-bit word hash of the values, C order, little-endian"
#: Sub-byte dtypes: one byte per element (ml_dtypes' layout), only the low bits carry the code.
CODE_BITS = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4}
CODE_BITS |= {"float6_e2m3fn": 6, "float6_e3m2fn": 6}


@dataclass(frozen=True)
class Partial:
    """What a box (or several, merged) contributes: both sums, the bytes it covered, and the
    words its edges cut (word index -> (bytes present, byte mask)), kept for ``merge``."""

    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    lane1: int = 0
    lane2: int = 0
    covered: int = 0
    fragments: Fragments = field(default_factory=lambda: join_fragments([]))


def merge(partials: Iterable[Partial]) -> Partial:
    """Partials of one leaf, in any order, as one: sums added, edge words joined (a whole word
    goes into the sums). Refuses partials of different leaves and boxes that overlap."""
    parts = list(partials)
    if not parts:
        raise ValueError("nothing to merge")
    first = parts[0]
    for p in parts:
        if (p.dtype, p.shape, p.nbytes) != (first.dtype, first.shape, first.nbytes):
            raise ValueError(
                f"cannot merge a partial of {p.dtype}{list(p.shape)} into one of "
                f"{first.dtype}{list(first.shape)}"
            )
    l1, l2, frags = _join(join_fragments([p.fragments for p in parts]), first.nbytes)
    l1 += sum(p.lane1 for p in parts)
    l2 += sum(p.lane2 for p in parts)
    covered = sum(p.covered for p in parts)
    return Partial(first.dtype, first.shape, first.nbytes, l1 & MASK, l2 & MASK, covered, frags)


def _join(frags: Fragments, nbytes: int) -> tuple[int, int, Fragments]:
    """Fragments of the same word ORed together (their masks must be disjoint: else two boxes
    overlap); the words now whole go into the sums, the rest stay fragments."""
    import numpy as np

    u, w, m = frags
    if u.size == 0:
        return 0, 0, frags
    order = np.argsort(u, kind="stable")
    u, w, m = u[order], w[order], m[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    mask = np.bitwise_or.reduceat(m, starts)
    clash = np.flatnonzero(mask != np.add.reduceat(m, starts))
    if clash.size:
        raise ValueError(
            f"two boxes both hold bytes of word {int(u[starts[clash[0]]])}: they overlap"
        )
    words, ug = np.bitwise_or.reduceat(w, starts), u[starts]
    last = (nbytes - 1) // 8
    full = np.full(ug.shape, 0xFF, np.uint64)
    full[ug == last] = full_mask(last, nbytes)
    whole = mask == full
    l1, l2 = fold_sorted(words[whole], ug[whole]) if whole.any() else (0, 0)
    cut = ~whole
    return l1, l2, (ug[cut], words[cut], mask[cut])


def finish(p: Partial) -> str:
    """The digest of a leaf whose partials are all merged into ``p``: ``ld1:`` + 32 hex."""
    open_words = int(p.fragments[0].size)
    if p.covered != p.nbytes or open_words:
        raise ValueError(
            f"the partials cover {p.covered:,} of the leaf's {p.nbytes:,} bytes"
            + (f" and leave {open_words} words open" if open_words else "")
            + ": a box is missing or counted twice"
        )
    h = header_hash(p.dtype, p.shape, p.nbytes)
    out1 = splitmix(p.lane1 + int.from_bytes(h[:8], "little"))
    out2 = splitmix(p.lane2 + int.from_bytes(h[8:16], "little"))
    return f"{TAG}:{out1:016x}{out2:016x}"


def header_hash(dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    text = f"{TAG}\n{dtype}\n{','.join(str(n) for n in shape)}\n{nbytes}"
    return hashlib.sha256(text.encode()).digest()


def dtype_name(x: Any) -> str:
    """The name a leaf's dtype goes by in the digest: numpy's / ml_dtypes' (``bfloat16``)."""
    return str(x.dtype.name)


def canonical_bytes(x: Any) -> Any:
    """A block's values as the digest's byte stream: C order, little-endian, the code bits of
    a sub-byte element only (uint8, flat)."""
    import numpy as np

    x = np.ascontiguousarray(x)
    if x.dtype.byteorder == ">" or (x.dtype.byteorder == "=" and not _little()):
        x = x.byteswap().view(x.dtype.newbyteorder("<"))
    raw = x.reshape(-1).view(np.uint8)
    bits = CODE_BITS.get(dtype_name(x))
    return raw & np.uint8((1 << bits) - 1) if bits else raw


def _little() -> bool:
    import sys

    return sys.byteorder == "little"


def partial(
    origin: tuple[int, ...], block: Any, shape: tuple[int, ...], dtype: str | None = None
) -> Partial:
    """The partial of one box of a leaf of ``shape``: ``block`` (an ndarray) at ``origin``."""
    import numpy as np

    block = np.asarray(block)
    name = dtype or dtype_name(block)
    item = block.dtype.itemsize
    nbytes = math.prod(shape) * item
    if len(origin) != len(shape) or block.ndim != len(shape):
        raise ValueError(f"a box of rank {block.ndim} at {origin} in a leaf of shape {shape}")
    if any(o < 0 or o + n > s for o, n, s in zip(origin, block.shape, shape, strict=True)):
        raise ValueError(f"the box {block.shape} at {origin} leaves the shape {shape}")
    data = canonical_bytes(block)
    starts, run = box_runs(origin, block.shape, shape)
    l1, l2, frags = fold_runs(data.reshape(len(starts), run * item), starts * item, nbytes)
    cut = join_fragments(frags)
    return merge([Partial(name, tuple(shape), nbytes, l1, l2, int(data.size), cut)])


def partial_bytes(
    data: Any, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]
) -> Partial:
    """The partial of a byte range of the stream already in digest form (a safetensors
    tensor's bytes, a string's UTF-8): ``data`` (uint8) at byte ``offset`` of ``nbytes``."""
    import numpy as np

    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    raw = raw.reshape(1, -1)
    l1, l2, frags = fold_runs(raw, np.array([offset], np.uint64), nbytes)
    cut = join_fragments(frags)
    return merge([Partial(dtype, tuple(shape), nbytes, l1, l2, int(raw.size), cut)])


def digest_array(x: Any, dtype: str | None = None) -> str:
    """The digest of a whole array."""
    import numpy as np

    x = np.asarray(x)
    return finish(partial((0,) * x.ndim, x, x.shape, dtype))


def digest_text(value: str, dtype: str = "string") -> str:
    """The digest of a string leaf (its UTF-8 bytes, shape ``()``)."""
    raw = value.encode()
    return finish(partial_bytes(raw, 0, len(raw), dtype, ()))
