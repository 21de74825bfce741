"""``ld1`` of a leaf taken slab after slab (``ld1_stream.Stream``) and the kernel's one-call
word sums (``ld1_kernel.word_sums``): the same bits as the box-by-box route and the spec's
reference, whatever the cuts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.digest import ld1, ld1_fold, ld1_kernel
from ckpt_cli.core.digest.ld1_stream import Stream, run_start
from tests.support.ldigest_reference import reference_digest

BW = ld1_fold.BLOCK_WORDS
KEYS = (ld1_fold.M1, ld1_fold.M2, ld1_fold.SEED_R1, ld1_fold.SEED_R2)


def _numpy_fold_words(raw: np.ndarray, u0: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    monkeypatch.setenv("CKPT_KERNELS", "0")
    ld1_kernel._block_sums_fn.cache_clear()
    ld1_kernel._words_fn.cache_clear()
    try:
        return ld1_fold.fold_words(raw, u0)
    finally:
        monkeypatch.delenv("CKPT_KERNELS")
        ld1_kernel._block_sums_fn.cache_clear()
        ld1_kernel._words_fn.cache_clear()


@pytest.mark.parametrize("path", ["c", "avx512", "auto"])
@pytest.mark.parametrize(
    ("words", "u0"),
    [(1, 0), (1, BW - 1), (2, BW - 1), (BW, 0), (BW, 5), (3 * BW + 7, BW - 3), (100, 7 * BW)],
)
def test_word_sums_equal_numpys_across_block_edges(
    path: str, words: int, u0: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(words + u0)
    raw = rng.integers(0, 256, 8 * words + 3, dtype=np.uint8)[3:]  # not on a word boundary
    a, c = ld1_fold.tables()
    got = ld1_kernel.word_sums(raw.view("<u8"), u0, a, c, KEYS, path)
    assert got is not None
    assert got == _numpy_fold_words(raw, u0, monkeypatch)


def test_word_sums_decline_what_is_not_contiguous() -> None:
    a, c = ld1_fold.tables()
    assert ld1_kernel.word_sums(np.zeros(64, np.uint64)[::2], 0, a, c, KEYS) is None


@pytest.mark.parametrize(
    ("origin", "box", "shape", "want"),
    [
        ((0, 0), (4, 6), (4, 6), 0),
        ((2, 0), (1, 6), (4, 6), 12),
        ((1, 0, 0), (2, 5, 6), (4, 5, 6), 30),
        ((1, 2, 0), (1, 3, 6), (4, 5, 6), 42),
        ((1, 2, 3), (1, 1, 2), (4, 5, 6), 45),
        ((0, 0), (2, 3), (4, 6), None),  # rows cut on the last axis: many runs
        ((1, 0, 0), (2, 2, 6), (4, 5, 6), None),
        ((0,), (3,), (4, 6), None),  # rank differs
    ],
)
def test_run_start(origin: tuple, box: tuple, shape: tuple, want: int | None) -> None:
    assert run_start(origin, box, shape) == want


def _slabs(x: np.ndarray, cuts: list[int]) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Runs of whole rows of ``x`` (first axis), then of elements inside a row where a cut
    falls inside one (for a 1-D leaf)."""
    out = []
    for a, b in zip([0, *cuts], [*cuts, x.shape[0]], strict=True):
        if b > a:
            out.append(((a,) + (0,) * (x.ndim - 1), x[a:b]))
    return out


DTYPES = [np.float32, np.float64, np.int8, np.uint16, ml_dtypes.bfloat16, ml_dtypes.int4]


@pytest.mark.parametrize("dtype", DTYPES)
def test_slabs_in_order_give_the_leafs_digest(dtype: type) -> None:
    """Cuts that fall inside words (odd element counts of 1- and 2-byte values), one-element
    slabs, and a last word that is short."""
    rng = np.random.default_rng(7)
    n = 3 * BW + 13  # elements: the stream ends inside a word for every itemsize below 8
    x = rng.integers(-8, 8, n).astype(dtype)
    want = reference_digest(x)
    assert ld1.digest_array(x) == want
    cuts = sorted({1, 2, 3, 11, 5000, BW + 1, 2 * BW - 3, 3 * BW + 12})
    s = Stream(ld1.dtype_name(x), x.shape, x.dtype.itemsize)
    slabs = _slabs(x, cuts)
    assert len(slabs) == len(cuts) + 1
    for origin, block in slabs:
        assert s.add(origin, block)
    assert s.offset == x.nbytes
    assert ld1.finish(s.partial()) == want


def test_rows_of_a_2d_leaf_and_a_big_endian_block() -> None:
    x = np.random.default_rng(3).standard_normal((37, 101)).astype(np.float32)
    s = Stream("float32", x.shape, 4)
    for a, b in [(0, 5), (5, 6), (6, 30), (30, 37)]:
        block = x[a:b].astype(">f4") if a == 5 else x[a:b]
        assert s.add((a, 0), block)
    assert ld1.finish(s.partial()) == ld1.digest_array(x)


def test_a_block_out_of_order_is_refused_and_merges_as_a_box() -> None:
    """What the stream does not take (a gap, a box of many runs) is hashed as a box; the
    stream's partial, with its open word, merges with those to the leaf's digest."""
    x = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float16)
    s = Stream("float16", x.shape, 2)
    assert s.add((0, 0), x[:3])
    assert not s.add((10, 0), x[10:20])  # not where the stream is
    assert not s.add((3, 0), x[3:10, :5])  # many runs
    assert s.offset == 3 * 33 * 2  # 198 bytes: the stream ends inside a word
    boxes = [ld1.partial((3, 0), x[3:64], x.shape)]
    assert ld1.finish(ld1.merge([s.partial(), *boxes])) == ld1.digest_array(x)


def test_a_stream_stopped_early_does_not_finish() -> None:
    x = np.arange(100, dtype=np.float32)
    s = Stream("float32", x.shape, 4)
    assert s.add((0,), x[:33])
    with pytest.raises(ValueError, match="cover"):
        ld1.finish(s.partial())


def test_streams_started_at_words_merge_to_the_leafs_digest() -> None:
    """A leaf's rows taken by three streams that start where their rows start (a chunk job
    each, ``scan._stream_jobs``), the last ending inside a word: their partials merge."""
    x = np.random.default_rng(9).standard_normal((24, 7)).astype(np.float16)  # 14-byte rows
    parts = []
    for a, b in [(0, 8), (8, 16), (16, 24)]:  # row 8 starts at byte 112, row 16 at 224
        s = Stream("float16", x.shape, 2, start=a * 14)
        assert s.add((a, 0), x[a:b])
        assert s.taken == (b - a) * 14
        parts.append(s.partial())
    assert [p.covered for p in parts] == [112, 112, 112]
    assert ld1.finish(ld1.merge(parts[::-1])) == reference_digest(x)
    s = Stream("float16", x.shape, 2, start=112)
    assert not s.add((0, 0), x[:8])  # not where this stream starts
    with pytest.raises(ValueError, match="word's first byte"):
        Stream("float16", x.shape, 2, start=14)
