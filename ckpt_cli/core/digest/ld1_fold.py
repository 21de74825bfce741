"""The word sums of ``ld1`` (``ld1.py`` is the digest built on them; the specification is
docs/reference/digest-spec.md): the keys of word blocks and positions (SplitMix64 outputs), the
mix ``m``, and the fast folds of a box's bytes into ``L1`` and ``L2``: runs of consecutive
C-order bytes as aligned words, short runs byte by byte, evenly spaced runs through windows of
the extended key tables (``_fold_strided``), and the words a box's edges cut kept as fragments
for ``ld1.merge``. numpy only inside the functions.
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

BLOCK_BITS = 14
BLOCK_WORDS = 1 << BLOCK_BITS
MASK = (1 << 64) - 1
M1, M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53
SEED_A, SEED_C = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03
SEED_R1, SEED_R2 = 0x8CB92BA72F3D8DD7, 0xABC98388FB8FAC03
#: Runs of a box at least this long are hashed as aligned words; shorter ones byte by byte.
_RUN_MIN = 256
_GROUP_BYTES = 1 << 20
_ROWS_BYTES = 256 << 10
#: Words per chunk of evenly spaced runs (cache-sized); fewer than ``_STRIDED_MIN``: grouped.
_STRIDED_WORDS = 16 << 10
_STRIDED_MIN = 2048
_EXT_BLOCKS = 10


def splitmix(x: int) -> int:
    """SplitMix64's output function (a bijection of 64-bit words)."""
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


@functools.lru_cache(maxsize=4096)
def block_keys(b: int) -> tuple[int, int]:
    """``(r1_b, r2_b)``: the odd keys of word block ``b``."""
    return splitmix(b + SEED_R1) | 1, splitmix(b + SEED_R2) | 1


def _splitmix_np(x: Any) -> Any:
    import numpy as np

    x = x.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _mix_np(y: Any) -> None:
    import numpy as np

    y *= np.uint64(M1)
    y ^= y >> np.uint64(32)
    y *= np.uint64(M2)
    y ^= y >> np.uint64(32)


@functools.cache
def tables() -> tuple[Any, Any]:
    """``a_j`` and ``c_j`` (odd) for the 16384 positions of a block."""
    import numpy as np

    j = np.arange(BLOCK_WORDS, dtype=np.uint64)
    return _splitmix_np(j + np.uint64(SEED_A)), _splitmix_np(j + np.uint64(SEED_C)) | np.uint64(1)


#: Cut words: (word indices, their bytes in place, byte masks), uint64 arrays sorted by index.
Fragments = tuple[Any, Any, Any]


def join_fragments(parts: list[Fragments]) -> Fragments:
    import numpy as np

    if not parts:
        return tuple(np.zeros(0, np.uint64) for _ in range(3))  # type: ignore[return-value]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]


def full_mask(u: int, nbytes: int) -> int:
    """The byte mask of a whole word ``u`` (the last word of the stream may be short)."""
    tail = nbytes - 8 * u
    return 0xFF if tail >= 8 else (1 << tail) - 1


def box_runs(origin: tuple[int, ...], box: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    """The box as runs of consecutive C-order elements: (start of each run, run length)."""
    import numpy as np

    t = len(shape) - 1
    while t >= 0 and box[t] == shape[t]:
        t -= 1
    if t < 0 or math.prod(box) == 0:
        return np.zeros(1, np.uint64), math.prod(box)
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    starts = np.full((), origin[t] * strides[t], np.uint64)
    for d in range(t):
        axis = (np.arange(box[d], dtype=np.uint64) + np.uint64(origin[d])) * np.uint64(strides[d])
        starts = np.add.outer(starts, axis)
    return starts.reshape(-1), box[t] * strides[t]


def fold_runs(rows: Any, starts: Any, nbytes: int) -> tuple[int, int, list[Fragments]]:
    """Both sums and the edge fragments of byte runs (``rows[r]`` at byte ``starts[r]``)."""
    import numpy as np

    count, length = rows.shape
    frags: list[Fragments] = []
    if length == 0 or count == 0:
        return 0, 0, frags
    if length < _RUN_MIN:
        l1 = l2 = 0
        per = max(1, _GROUP_BYTES // length)
        for g in range(0, count, per):
            offs = starts[g : g + per, None] + np.arange(length, dtype=np.uint64)
            s1, s2 = _fold_scattered(offs.reshape(-1), rows[g : g + per].reshape(-1), nbytes, frags)
            l1, l2 = l1 + s1, l2 + s2
        return l1 & MASK, l2 & MASK, frags
    if count == 1:
        p = int(starts[0])
        h = min(length, -p % 8)
        l1, l2 = fold_words(rows[0, h : h + (length - h) // 8 * 8], (p + h) // 8)
        edges = [_edges(rows, starts, np.zeros(1, np.int64), h, length)]
    else:
        l1 = l2 = 0
        edges = []
        phase = (starts % np.uint64(8)).astype(np.int64)
        for ph in np.unique(phase).tolist():
            h = min(length, -ph % 8)
            sel = np.flatnonzero(phase == ph)
            s1, s2 = _fold_phase(rows, starts, sel, h, length)
            l1, l2 = l1 + s1, l2 + s2
            edges.append(_edges(rows, starts, sel, h, length))
    offs = np.concatenate([e[0] for e in edges])
    if offs.size:
        order = np.argsort(offs, kind="stable")
        values = np.concatenate([e[1] for e in edges])
        s1, s2 = _fold_scattered(offs[order], values[order], nbytes, frags)
        l1, l2 = l1 + s1, l2 + s2
    return l1 & MASK, l2 & MASK, frags


def _fold_phase(rows: Any, starts: Any, sel: Any, head: int, length: int) -> tuple[int, int]:
    """Both sums over the whole words of the runs ``sel`` (indices, increasing), which all
    start at the same offset in a word: every run in one call of the compiled kernel
    (``ld1_kernel.run_sums``) where it is built; else evenly spaced runs (a box of a sharded
    leaf) in one strided pass (``_fold_strided``), others in groups that stay in the cache."""
    import numpy as np

    from ckpt_cli.core.digest.ld1_kernel import run_sums

    k = (length - head) // 8
    if k == 0:
        return 0, 0
    u0 = (starts[sel] + np.uint64(head)) >> np.uint64(3)
    a, c = tables()
    got = run_sums(rows, sel, head, k, u0, a, c, (M1, M2, SEED_R1, SEED_R2))
    if got is not None:  # every run in one call of the compiled kernel: no GIL held
        return got[0] & MASK, got[1] & MASK
    gaps = np.diff(sel)
    steps = np.diff(u0.astype(np.int64))
    if gaps.size == 0 or (np.all(gaps == gaps[0]) and np.all(steps == steps[0])):
        gap = int(gaps[0]) if gaps.size else 1
        view = rows[int(sel[0]) : int(sel[-1]) + 1 : gap, head : head + 8 * k]
        step = int(steps[0]) if steps.size else 0
        done = _fold_spaced(view, int(u0[0]), step, k)
        if done is not None:
            return done
    l1 = l2 = 0
    per = max(1, _ROWS_BYTES // length)  # temporaries of _fold_rows stay in the cache
    for g in range(0, sel.size, per):
        part = sel[g : g + per]
        s1, s2 = _fold_rows(rows[part], starts[part], head, length)
        l1, l2 = l1 + s1, l2 + s2
    return l1 & MASK, l2 & MASK


@functools.cache
def _tables_ext() -> tuple[Any, Any]:
    """``a`` and ``c`` repeated ``_EXT_BLOCKS`` times (read-only): windows of ``k`` positions
    that start in the first block and step at most ``_EXT_BLOCKS - 2`` blocks in all are one
    strided view."""
    import numpy as np

    a, c = tables()
    out = np.tile(a, _EXT_BLOCKS), np.tile(c, _EXT_BLOCKS)
    for t in out:
        t.flags.writeable = False
    return out


def _windows(table: Any, j: int, step: int, rows: int, k: int) -> Any:
    """``table[(j + r * step + i) mod BLOCK_WORDS]`` for ``r < rows``, ``i < k``: a view of
    the repeated table (``step`` reduced to ``|step| <= BLOCK_WORDS / 2`` by the caller)."""
    import numpy as np

    if step < 0:  # the first row's window shifted up whole blocks, the others below it
        j += -((rows - 1) * step // BLOCK_WORDS) * BLOCK_WORDS
    return np.ndarray((rows, k), np.uint64, buffer=table, offset=8 * j, strides=(8 * step, 8))


def _chunk_rows(step: int, k: int) -> tuple[int, int]:
    """The step reduced to ``|red| <= BLOCK_WORDS / 2`` modulo a block, and the rows of ``k``
    words per chunk: cache-sized, and few enough that their windows fit the repeated tables."""
    red = step % BLOCK_WORDS
    red = red - BLOCK_WORDS if red > BLOCK_WORDS // 2 else red
    per = max(1, _STRIDED_WORDS // k)
    if red:
        per = min(per, ((_EXT_BLOCKS - 2) * BLOCK_WORDS - k) // abs(red) + 1)
    return red, per


def _fold_spaced(words: Any, u_first: int, step: int, k: int) -> tuple[int, int] | None:
    """``_fold_strided``, over ``q`` interleaved sets of rows (every ``q``-th) when the rows
    ``q`` apart are much closer modulo a block (a step of 4099 words: 4 rows are 12 words
    apart), so that a chunk holds as many rows as the cache allows."""
    n = words.shape[0]
    full = max(1, _STRIDED_WORDS // k)
    gain = [(min(_chunk_rows(step * q, k)[1], -(-n // q)), -q) for q in range(1, 17)]
    q = -max(gain)[1] if _chunk_rows(step, k)[1] < min(full, n) else 1
    l1 = l2 = 0
    for p in range(q):
        done = _fold_strided(words[p::q], u_first + p * step, step * q, k)
        if done is None:
            return None
        l1, l2 = l1 + done[0], l2 + done[1]
    return l1 & MASK, l2 & MASK


def _fold_strided(words: Any, u_first: int, step: int, k: int) -> tuple[int, int] | None:
    """Both sums over evenly spaced runs of ``k`` whole words: ``words`` (uint8 rows of 8k
    bytes), run ``r`` at word ``u_first + r * step``. Per chunk of rows (sized for the cache)
    the table entries are one strided view (no gather); each row's sums are then weighted by
    its block keys (``_weigh``). ``None``: the runs are too far apart in their blocks for
    chunks worth the numpy calls."""
    import numpy as np

    n = words.shape[0]
    red, per = _chunk_rows(step, k)
    if k > BLOCK_WORDS // 2 or (per * k < _STRIDED_MIN and n > per):
        return None
    a_ext, c_ext = _tables_ext()
    u = np.uint64(u_first) + np.arange(n, dtype=np.uint64) * np.uint64(step)
    split = (np.uint64(BLOCK_WORDS) - (u & np.uint64(BLOCK_WORDS - 1))).astype(np.int64)
    cross = np.flatnonzero(split < k).tolist()  # rows that run into the next block
    sums = np.empty((2, n), np.uint64)
    tails = np.zeros((2, len(cross)), np.uint64)
    y = np.empty((per, k), np.uint64)
    tmp = np.empty((per, k), np.uint64)
    for g in range(0, n, per):
        m = min(per, n - g)
        j = (u_first + g * step) % BLOCK_WORDS
        yg, tg = y[:m], tmp[:m]
        np.copyto(yg.view(np.uint8), words[g : g + m])  # aligned, whatever the source
        yg += _windows(a_ext, j, red, m, k)
        _mix_into(yg, tg)
        cwin = _windows(c_ext, j, red, m, k)
        lo, hi = bisect.bisect_left(cross, g), bisect.bisect_left(cross, g + m)
        if hi > lo:
            rows = np.array(cross[lo:hi]) - g
            _tail_sums(yg, cwin, rows, split[rows + g], tails[:, lo:hi])
        yg.sum(axis=1, out=sums[0, g : g + m])
        yg *= cwin
        yg.sum(axis=1, out=sums[1, g : g + m])
    return _weigh(u >> np.uint64(BLOCK_BITS), sums, np.array(cross, np.int64), tails)


def _mix_into(y: Any, tmp: Any) -> None:
    """``_mix_np`` with a scratch array for the shifts (no temporaries)."""
    import numpy as np

    for mult in (M1, M2):
        y *= np.uint64(mult)
        np.right_shift(y, np.uint64(32), out=tmp)
        y ^= tmp


def _tail_sums(y: Any, cwin: Any, rows: Any, split: Any, out: Any) -> None:
    """The same two sums over the words of ``rows`` from ``split`` on (past their block)."""
    import numpy as np

    tail = np.arange(y.shape[1])[None, :] >= split[:, None]
    part = np.where(tail, y[rows], 0)
    part.sum(axis=1, out=out[0])
    np.einsum("ij,ij->i", part, cwin[rows], out=out[1])


def _weigh(b: Any, sums: Any, cross: Any, tails: Any) -> tuple[int, int]:
    """Both lanes: row ``r``'s sums times its block's keys, plus its tail (if any) times the
    difference of the next block's keys."""
    import numpy as np

    r1, r2 = _keys(b)
    l1 = int((sums[0] * r1).sum())
    l2 = int((sums[1] * r2).sum())
    if cross.size:
        n1, n2 = _keys(b[cross] + np.uint64(1))
        l1 += int((tails[0] * (n1 - r1[cross])).sum())
        l2 += int((tails[1] * (n2 - r2[cross])).sum())
    return l1 & MASK, l2 & MASK


def _keys(b: Any) -> tuple[Any, Any]:
    """``(r1_b, r2_b)`` of an array of block indices."""
    import numpy as np

    one = np.uint64(1)
    return _splitmix_np(b + np.uint64(SEED_R1)) | one, _splitmix_np(b + np.uint64(SEED_R2)) | one


def _edges(rows: Any, starts: Any, sel: Any, head: int, length: int) -> tuple[Any, Any]:
    """The bytes of the runs ``sel`` (indices) before their first whole word and after their
    last."""
    import numpy as np

    tail = head + (length - head) // 8 * 8
    cols = np.r_[np.arange(head), np.arange(tail, length)].astype(np.int64)
    offs = starts[sel, None] + cols.astype(np.uint64)
    return offs.reshape(-1), rows[sel[:, None], cols[None, :]].reshape(-1)  # edges only


def _fold_rows(rows: Any, starts: Any, head: int, length: int) -> tuple[int, int]:
    """Both sums over the whole words of runs that all start at the same offset in a word.

    A run inside one block of words takes its table entries as one window of the tables (a
    row copy, not a gather per word); the few runs that cross into the next block go word
    range by word range (``fold_words``)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    k = (length - head) // 8
    if k == 0:
        return 0, 0
    w = np.ascontiguousarray(rows[:, head : head + 8 * k]).view("<u8")
    u0 = (starts + np.uint64(head)) >> np.uint64(3)
    j0 = (u0 & np.uint64(BLOCK_WORDS - 1)).astype(np.int64)
    cross = j0 + k > BLOCK_WORDS
    l1 = l2 = 0
    for r in np.flatnonzero(cross).tolist():
        s1, s2 = fold_words(w[r].view(np.uint8), int(u0[r]))
        l1, l2 = l1 + s1, l2 + s2
    if cross.any():
        keep = ~cross
        w, u0, j0 = w[keep], u0[keep], j0[keep]
    if w.size:
        a, c = tables()
        y = sliding_window_view(a, k)[j0]
        y += w
        _mix_np(y)
        b = u0 >> np.uint64(BLOCK_BITS)
        r1 = _splitmix_np(b + np.uint64(SEED_R1)) | np.uint64(1)
        r2 = _splitmix_np(b + np.uint64(SEED_R2)) | np.uint64(1)
        l1 += int((y.sum(axis=1) * r1).sum())
        y *= sliding_window_view(c, k)[j0]
        l2 += int((y.sum(axis=1) * r2).sum())
    return l1 & MASK, l2 & MASK


def fold_words(raw: Any, u0: int) -> tuple[int, int]:
    """Both sums over whole words: ``raw`` (uint8, a multiple of 8 bytes) is words u0, u0+1...

    In one call of the compiled kernel where it is built (``ld1_kernel.word_sums``); else the
    words up to the first block boundary and after the last one go span by span; the
    whole blocks between them in groups of ``_SPAN_BLOCKS`` rows (``_fold_blocks``)."""
    import numpy as np

    from ckpt_cli.core.digest.ld1_kernel import word_sums

    w = raw.view("<u8") if raw.size else np.zeros(0, np.uint64)
    if w.size:
        a, c = tables()
        got = word_sums(w, u0, a, c, (M1, M2, SEED_R1, SEED_R2))
        if got is not None:
            return got
    head = min(w.size, -u0 % BLOCK_WORDS)
    whole = (w.size - head) // BLOCK_WORDS * BLOCK_WORDS
    l1, l2 = _fold_span(w[:head], u0)
    if whole:
        s1, s2 = _fold_blocks(w[head : head + whole], (u0 + head) // BLOCK_WORDS)
        l1, l2 = l1 + s1, l2 + s2
    s1, s2 = _fold_span(w[head + whole :], u0 + head + whole)
    return (l1 + s1) & MASK, (l2 + s2) & MASK


def _fold_span(w: Any, u0: int) -> tuple[int, int]:
    """Both sums over words ``w`` (uint64) at u0, u0+1..., all inside one block."""
    import numpy as np

    if not w.size:
        return 0, 0
    from ckpt_cli.core.digest.ld1_kernel import block_sums

    a, c = tables()
    b, j = divmod(u0, BLOCK_WORDS)
    r1, r2 = block_keys(b)
    aw, cw = a[j : j + w.size], c[j : j + w.size]
    # The compiled kernel takes a span as one row of its own width (the tables from word j):
    # the numpy calls below hold the GIL between their steps, and every slab has two spans.
    sums = block_sums(w.reshape(1, -1), aw, cw, M1, M2)
    if sums is not None:
        return (r1 * int(sums[0, 0])) & MASK, (r2 * int(sums[1, 0])) & MASK
    y = np.add(w, aw)
    _mix_into(y, np.empty_like(y))
    return (r1 * int(y.sum())) & MASK, (r2 * int(np.dot(y, cw))) & MASK


#: Whole blocks per group of ``_fold_blocks``: numpy calls of 4 MiB. Threads hash at once only
#: if each call runs long next to the GIL hand-over around it: on the 13-core TPU host, calls of
#: 128 KiB (one block) made 13 threads 3x slower than one; at 4 MiB they are 2x faster, and one
#: thread is 20% faster too. The scratch is two arrays of up to this many blocks (8 MiB).
_SPAN_BLOCKS = 32


def _fold_blocks(w: Any, b0: int) -> tuple[int, int]:
    """Both sums over whole blocks ``b0, b0+1...`` (``w``: their words): each block's two sums
    by the compiled kernel (``ld1_kernel``) or numpy, then weighed by the blocks' keys."""
    import numpy as np

    from ckpt_cli.core.digest.ld1_kernel import block_sums

    a, c = tables()
    rows = w.reshape(-1, BLOCK_WORDS)
    n = rows.shape[0]
    sums = block_sums(rows, a, c, M1, M2)
    if sums is None:
        sums = _block_sums_np(rows, a, c)
    r1, r2 = _keys(np.arange(b0, b0 + n, dtype=np.uint64))
    return int((sums[0] * r1).sum()) & MASK, int((sums[1] * r2).sum()) & MASK


def _block_sums_np(rows: Any, a: Any, c: Any) -> Any:
    """``ld1_kernel.block_sums`` in numpy: ``_SPAN_BLOCKS`` rows per call, into two scratch
    arrays allocated once (no temporaries)."""
    import numpy as np

    n = rows.shape[0]
    sums = np.empty((2, n), np.uint64)
    y = np.empty((min(_SPAN_BLOCKS, n), BLOCK_WORDS), np.uint64)
    tmp = np.empty_like(y)
    for g in range(0, n, _SPAN_BLOCKS):
        m = min(_SPAN_BLOCKS, n - g)
        yg = y[:m]
        np.add(rows[g : g + m], a, out=yg)
        _mix_into(yg, tmp[:m])
        yg.sum(axis=1, out=sums[0, g : g + m])
        yg *= c
        yg.sum(axis=1, out=sums[1, g : g + m])
    return sums


def _fold_scattered(offs: Any, values: Any, nbytes: int, frags: list[Fragments]) -> tuple[int, int]:
    """Bytes at increasing stream offsets: whole words go into the sums (returned), cut words
    onto ``frags`` (``merge`` joins them with the other pieces of their words)."""
    import numpy as np

    u = offs >> np.uint64(3)
    shift = (offs & np.uint64(7)) * np.uint64(8)
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    words = np.bitwise_or.reduceat(values.astype(np.uint64) << shift, starts)
    masks = np.bitwise_or.reduceat(np.uint64(1) << (offs & np.uint64(7)), starts)
    uw = u[starts]
    last = (nbytes - 1) // 8
    full = np.full(uw.shape, 0xFF, np.uint64)
    full[uw == last] = full_mask(last, nbytes)
    whole = masks == full
    l1 = l2 = 0
    if whole.any():
        l1, l2 = fold_sorted(words[whole], uw[whole])
    cut = ~whole
    if cut.any():
        frags.append((uw[cut], words[cut], masks[cut]))
    return l1, l2


def fold_sorted(w: Any, u: Any) -> tuple[int, int]:
    """Both sums over whole words ``w`` at increasing word indices ``u``."""
    import numpy as np

    a, c = tables()
    j = u & np.uint64(BLOCK_WORDS - 1)
    b = u >> np.uint64(BLOCK_BITS)
    y = w + a[j]
    _mix_np(y)
    seg = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    sums1 = np.add.reduceat(y, seg).tolist()
    y *= c[j]
    sums2 = np.add.reduceat(y, seg).tolist()
    l1 = l2 = 0
    for block, x1, x2 in zip(b[seg].tolist(), sums1, sums2, strict=True):
        r1, r2 = block_keys(block)
        l1, l2 = l1 + r1 * x1, l2 + r2 * x2
    return l1 & MASK, l2 & MASK
