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
    try:
        assert not ld1_kernel.available()
        assert ld1.digest_array(x) == with_kernel
    finally:
        monkeypatch.delenv("CKPT_KERNELS")
        ld1_kernel._block_sums_fn.cache_clear()
    assert ld1_kernel.available()


def test_rows_not_contiguous_fall_back_to_numpy() -> None:
    words = np.zeros((4, 2 * BW), np.uint64)[:, :BW]
    a, c = ld1_fold.tables()
    assert ld1_kernel.block_sums(words, a, c, ld1_fold.M1, ld1_fold.M2) is None
