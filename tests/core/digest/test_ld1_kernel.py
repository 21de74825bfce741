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
