"""trend's compiled block statistics (``ckpt_trend_stats`` in ``ckpt_cli/_kernels.c``) give
numpy's figures: the same counts, maxima and units' flags, sums within 1e-12, for every dtype
the kernel reads, on blocks holding NaN, Inf, zeros and -0.0, in its four-lane (AVX2) and
two-lane loops; other blocks fall back to numpy, as does a tree with ``CKPT_KERNELS=0``."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.trend import kernel
from ckpt_cli.core.trend.accum import Acc, stats_numpy

DTYPES = [np.float32, np.float64, ml_dtypes.bfloat16, np.float16]


def block(dtype: Any, shape: tuple[int, ...], seed: int, scale: float = 1.0) -> np.ndarray:
    """Normal values with every special value planted: NaN, +-Inf, 0, -0.0, a unit all 0, a
    unit all -0.0, a unit 0 but for one NaN, and (float16) subnormals."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    flat = x.reshape(-1, shape[-1])
    flat[0, :5] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]).astype(dtype)
    flat[:, 5] = 0
    flat[:, 6] = np.array(-0.0).astype(dtype)
    flat[:, 7] = 0
    flat[len(flat) // 2, 7] = np.array(np.nan).astype(dtype)
    if dtype == np.float16:
        x.reshape(-1)[20:23] = np.array([6e-8, -3e-6, 6.1e-5]).astype(dtype)
    return x


def assert_same(got: tuple[Any, ...] | None, want: tuple[Any, ...]) -> None:
    assert got is not None
    zeros, nonfinite, total, squares, max_abs, update = got
    assert (zeros, nonfinite, max_abs) == (want[0], want[1], want[4])
    scale = want[3] ** 0.5 * 1e-12 + 1e-300  # a sum may cancel: compared against the norm
    assert total == pytest.approx(want[2], rel=1e-12, abs=scale)
    assert squares == pytest.approx(want[3], rel=1e-12)
    assert update == pytest.approx(want[5], rel=1e-12, abs=1e-300)


def test_the_kernel_is_built_and_loaded() -> None:
    assert kernel.available(), "ckpt_cli/_kernels.c was not compiled: run `make .venv/.installed`"


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("shape", [(257, 37), (4099,), (3, 5, 1031)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_gives_numpys_figures(dtype: Any, shape: tuple[int, ...], narrow: bool) -> None:
    x = block(dtype, shape, 1)
    prev = block(dtype, shape, 2, scale=1.5)
    prev.reshape(-1)[11] = np.array(np.nan).astype(dtype)  # an update only one step can have
    units = shape[-1] if len(shape) >= 2 else None
    alive_k = np.zeros(units or 1, bool)
    alive_n = np.zeros(units or 1, bool)
    got = kernel.block_stats(x, prev, alive_k if units else None, narrow=narrow)
    want = stats_numpy(x, prev, alive_n if units else None)
    assert want[0] > 0 and want[1] == 3 + 1  # the planted zeros, NaN and Inf are all there
    assert_same(got, want)
    assert_same(kernel.block_stats(x, None, None, narrow=narrow), stats_numpy(x))
    if units:
        assert np.array_equal(alive_k, alive_n)
        assert not alive_k[5] and not alive_k[6] and alive_k[7]  # 0, -0.0, 0 but a NaN


@pytest.mark.parametrize("n", [0, 1, 3, 1023, 1024, 1025, 2 * 1024 + 7])
def test_the_strips_edges_count_right(n: int) -> None:
    x = np.zeros(n, np.float32)
    x[::3] = np.arange(len(x[::3]), dtype=np.float32) - 5
    if n > 2:
        x[-1] = np.inf
    for narrow in (False, True):
        assert_same(kernel.block_stats(x, x[::-1].copy(), narrow=narrow), stats_numpy(x, x[::-1]))


def test_sums_keep_float64_precision_on_large_blocks() -> None:
    """Values of very different sizes: float32 sums would lose the small ones."""
    x = np.full(1 << 20, 1e-3, np.float32)
    x[::1000] = 1e6
    exact = float(np.sum(x.astype(np.float64)))
    got = kernel.block_stats(x)
    assert got is not None
    assert got[2] == pytest.approx(exact, rel=1e-14)
    assert got[2] != pytest.approx(float(np.sum(x, dtype=np.float32)), rel=1e-9)


def test_blocks_it_does_not_read_fall_back_to_numpy() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert kernel.block_stats(x.astype(np.int32)) is None  # not a float it reads
    assert kernel.block_stats(x.astype(">f4")) is None  # not the machine's byte order
    assert kernel.block_stats(x[:, ::2]) is None  # not contiguous
    assert kernel.block_stats(x, x.astype(np.float64)) is None  # steps of different dtypes
    acc = Acc()
    acc.add(x.astype(np.int32), x.astype(np.int32) + 1, (4, slice(0, 4)))
    assert (acc.size, acc.zeros, acc.total, acc.update, acc.max_abs) == (12, 1, 66.0, 12.0, 11.0)
    assert acc.alive is not None and acc.alive.tolist() == [True] * 4


def test_accumulators_are_the_same_with_the_kernel_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = block(ml_dtypes.bfloat16, (64, 96), 3)
    prev = block(ml_dtypes.bfloat16, (64, 96), 4)

    def accumulate() -> Acc:
        acc = Acc()
        acc.add(x[:32], prev[:32], (96, slice(0, 96)))
        acc.add(x[32:], prev[32:], (96, slice(0, 96)))
        return acc

    with_kernel = accumulate()
    monkeypatch.setenv("CKPT_KERNELS", "0")
    kernel._stats_fn.cache_clear()
    try:
        assert not kernel.available()
        without = accumulate()
    finally:
        monkeypatch.delenv("CKPT_KERNELS")
        kernel._stats_fn.cache_clear()
    assert kernel.available()
    assert (with_kernel.size, with_kernel.finite, with_kernel.zeros, with_kernel.nonfinite) == (
        without.size,
        without.finite,
        without.zeros,
        without.nonfinite,
    )
    assert with_kernel.nonfinite > 0 and with_kernel.zeros > 0
    assert with_kernel.max_abs == without.max_abs
    assert with_kernel.total == pytest.approx(without.total, rel=1e-12)
    assert with_kernel.squares == pytest.approx(without.squares, rel=1e-12)
    assert with_kernel.update == pytest.approx(without.update, rel=1e-12)
    assert np.array_equal(with_kernel.alive, without.alive)
