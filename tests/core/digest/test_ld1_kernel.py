"""The compiled block sums (``ckpt_cli/_kernels.c``) give numpy's bits, and are in use.

``make test`` installs the package, which compiles the kernel: a tree where it is missing would
hash in numpy, correct but capped by the GIL on many cores, so its absence fails here."""

from __future__ import annotations

import numpy as np
import pytest

from ckpt_cli.core.digest import ld1, ld1_fold, ld1_kernel

BW = ld1_fold.BLOCK_WORDS


def test_the_kernel_is_built_and_loaded() -> None:
    assert ld1_kernel.available(), (
        "ckpt_cli/_kernels.c was not compiled: run `make .venv/.installed`"
    )
    assert ld1_kernel._words_fn() is not None, "a stale build: run `make .venv/.installed`"


@pytest.mark.parametrize("blocks", [1, 2, 33, 70])
@pytest.mark.parametrize("misalign", [0, 3])
def test_kernel_sums_equal_numpys(blocks: int, misalign: int) -> None:
    rng = np.random.default_rng(blocks * 10 + misalign)
    raw = rng.integers(0, 256, blocks * BW * 8 + misalign, dtype=np.uint8)[misalign:]
    rows = raw.view("<u8").reshape(blocks, BW) if misalign == 0 else None
    a, c = ld1_fold.tables()
    want = ld1_fold._block_sums_np(np.frombuffer(raw.tobytes(), "<u8").reshape(blocks, BW), a, c)
    if rows is None:  # bytes not on a word boundary: the kernel reads them as they lie
        rows = np.ndarray((blocks, BW), "<u8", buffer=raw.data, strides=(BW * 8, 8))
    got = ld1_kernel.block_sums(rows, a, c, ld1_fold.M1, ld1_fold.M2)
    assert got is not None
    assert got.shape == (2, blocks)
    assert np.array_equal(got, want)


def test_digests_are_the_same_with_the_kernel_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(1).standard_normal((300, 1031)).astype(np.float32)
    with_kernel = ld1.digest_array(x)
    monkeypatch.setenv("CKPT_KERNELS", "0")
    ld1_kernel._block_sums_fn.cache_clear()
    ld1_kernel._words_fn.cache_clear()
    try:
        assert not ld1_kernel.available()
        assert ld1_kernel._words_fn() is None
        assert ld1.digest_array(x) == with_kernel
    finally:
        monkeypatch.delenv("CKPT_KERNELS")
        ld1_kernel._block_sums_fn.cache_clear()
        ld1_kernel._words_fn.cache_clear()
    assert ld1_kernel.available()


def test_rows_not_contiguous_fall_back_to_numpy() -> None:
    words = np.zeros((4, 2 * BW), np.uint64)[:, :BW]
    a, c = ld1_fold.tables()
    assert ld1_kernel.block_sums(words, a, c, ld1_fold.M1, ld1_fold.M2) is None


def _sums(rows: np.ndarray, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Both sums of rows of any width, as the kernel's comment defines them (mod 2^64)."""
    y = rows + a
    for m in (ld1_fold.M1, ld1_fold.M2):
        y = y * np.uint64(m)
        y ^= y >> np.uint64(32)
    return np.stack([y.sum(axis=1, dtype=np.uint64), (y * c).sum(axis=1, dtype=np.uint64)])


@pytest.mark.parametrize("path", ["c", "avx512", "auto"])
@pytest.mark.parametrize("width", [BW, 8, 7, 5, 1])
def test_every_path_of_the_kernel_gives_numpys_sums(path: str, width: int) -> None:
    """Plain C and AVX-512 (eight words a step with its 64-bit multiply, where this CPU has
    AVX512DQ): the same sums to the bit, also for rows whose width leaves words after the last
    whole vector."""
    rng = np.random.default_rng(width)
    blocks = 3
    rows = rng.integers(0, 2**64, (blocks, width), dtype=np.uint64, endpoint=False)
    rows[0, :] = np.uint64(2**64 - 1)  # every carry
    a, c = ld1_fold.tables()
    a, c = np.ascontiguousarray(a[:width]), np.ascontiguousarray(c[:width])
    want = _sums(rows, a, c)
    if width == BW:  # the reference is the library's numpy route
        assert np.array_equal(want, ld1_fold._block_sums_np(rows, a, c))
    got, taken = ld1_kernel.block_sums_on(rows, a, c, ld1_fold.M1, ld1_fold.M2, path)
    assert taken in ld1_kernel.PATHS
    if path != "auto":
        assert ld1_kernel.PATHS[taken] <= ld1_kernel.PATHS[path]
    assert np.array_equal(got, want), (path, taken)


def _fold_words_numpy(words: np.ndarray, u0: int) -> tuple[int, int]:
    """``fold_words`` with the kernel out of the way (its numpy route, block by block)."""
    head = min(words.size, -u0 % BW)
    l1, l2 = ld1_fold._fold_span(words[:head], u0)
    rest = words[head:]
    for i in range(0, rest.size, BW):
        s1, s2 = ld1_fold._fold_span(rest[i : i + BW], u0 + head + i)
        l1, l2 = l1 + s1, l2 + s2
    return l1 & ld1_fold.MASK, l2 & ld1_fold.MASK


@pytest.mark.parametrize("path", ["c", "auto"])
@pytest.mark.parametrize(
    ("runs", "k", "head", "step"),
    [(5, 256, 0, 512), (40, 300, 3, 1000), (3, BW + 5, 5, 3 * BW), (7, 1, 0, 1), (6, 40, 1, -90)],
)
def test_runs_in_one_call_give_each_runs_sums(
    path: str, runs: int, k: int, head: int, step: int
) -> None:
    """``ckpt_ld1_runs``: ``k`` whole words of every selected row from byte ``head`` on, each
    run its own words of the stream (evenly spaced, crossing block boundaries, going back), the
    sums of all runs; each run taken alone by the numpy route gives the same."""
    rng = np.random.default_rng(runs * 1000 + k)
    length = head + 8 * k + 3
    rows = rng.integers(0, 256, (2 * runs, length), dtype=np.uint8)
    sel = np.arange(0, 2 * runs, 2)  # every other row: the rows' own stride is not the runs'
    u0s = np.array([10 * BW + 17 + r * step for r in range(runs)], np.uint64)
    a, c = ld1_fold.tables()
    keys = (ld1_fold.M1, ld1_fold.M2, ld1_fold.SEED_R1, ld1_fold.SEED_R2)
    got = ld1_kernel.run_sums(rows, sel, head, k, u0s, a, c, keys, path)
    assert got is not None
    l1 = l2 = 0
    for r, row in zip(u0s.tolist(), sel.tolist(), strict=True):
        words = np.frombuffer(rows[row, head : head + 8 * k].tobytes(), "<u8")
        s1, s2 = _fold_words_numpy(words, r)
        l1, l2 = l1 + s1, l2 + s2
    assert (got[0] & ld1_fold.MASK, got[1] & ld1_fold.MASK) == (
        l1 & ld1_fold.MASK,
        l2 & ld1_fold.MASK,
    )


@pytest.mark.parametrize(
    ("shape", "origin", "box"),
    [
        ((4096, 1024), (0, 512), (2048, 512)),  # a reshard's (2, 4) block of a one-chunk leaf
        ((4096, 1024), (2048, 0), (2048, 256)),
        ((300, 1031), (3, 5), (290, 1000)),  # runs cut inside words
        ((16, 40, 200), (4, 4, 21), (8, 30, 150)),  # 3-D: runs at two spacings, cut words
        ((9, 70000), (1, 3), (5, 69990)),  # runs longer than a block of words
    ],
)
def test_box_partials_are_numpys_and_take_the_kernel(
    shape: tuple[int, ...],
    origin: tuple[int, ...],
    box: tuple[int, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A box cut on a later axis hashes its runs in the kernel (one call a phase), and its
    partial is the numpy route's to the bit."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    block = np.ascontiguousarray(
        x[tuple(slice(o, o + n) for o, n in zip(origin, box, strict=True))]
    )
    calls: list[object] = []
    real = ld1_kernel.run_sums

    def counted(*a: object, **k: object) -> tuple[int, int] | None:
        out = real(*a, **k)  # type: ignore[arg-type]
        calls.append(out)
        return out

    monkeypatch.setattr(ld1_kernel, "run_sums", counted)
    with_kernel = ld1.partial(origin, block, shape)
    assert calls, "the box's runs did not reach the kernel"
    assert all(c is not None for c in calls)
    monkeypatch.setattr(ld1_kernel, "run_sums", lambda *a, **k: None)
    numpy_route = ld1.partial(origin, block, shape)
    assert _fields(with_kernel) == _fields(numpy_route)
    whole = ld1.finish(
        ld1.merge(
            [with_kernel]
            + [
                ld1.partial(o, np.ascontiguousarray(x[sl]), shape)
                for o, sl in _rest_of(shape, origin, box)
            ]
        )
    )
    assert whole == ld1.digest_array(x)


def _rest_of(
    shape: tuple[int, ...], origin: tuple[int, ...], box: tuple[int, ...]
) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Boxes that with ``box`` at ``origin`` cover the array once (peeled axis by axis)."""
    out = []
    lo = [0] * len(shape)
    hi = list(shape)
    for d in range(len(shape)):
        for a, b in ((lo[d], origin[d]), (origin[d] + box[d], hi[d])):
            if b > a:
                sl = [slice(lo[e], hi[e]) for e in range(len(shape))]
                sl[d] = slice(a, b)
                out.append((tuple(s.start for s in sl), tuple(sl)))
        lo[d], hi[d] = origin[d], origin[d] + box[d]
    return out


def _fields(p: ld1.Partial) -> tuple[object, ...]:
    """A partial's sums, bytes and cut words as plain values (its fragments are arrays)."""
    frags = tuple(np.asarray(f).tolist() for f in p.fragments)
    return (p.dtype, p.shape, p.nbytes, p.lane1, p.lane2, p.covered, frags)
