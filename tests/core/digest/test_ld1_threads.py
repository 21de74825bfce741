"""One block's ``ld1`` hashed in parts on several threads equals the whole block's."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.digest import ld1_threads
from ckpt_cli.core.digest.ld1 import digest_array, finish, merge, partial


@pytest.mark.parametrize("pieces", [2, 3, 4, 7, 13])
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1001,), np.uint8), ((37, 29), np.int8), ((5, 13, 7), np.float32), ((9, 3), np.int16)],
)
def test_the_parts_of_a_box_merge_to_the_box(
    pieces: int, shape: tuple[int, ...], dtype: type
) -> None:
    """Cuts at odd rows (bytes 1001 / 7 apart: inside 64-bit words) merge to the same value."""
    x = np.random.default_rng(pieces).integers(0, 100, shape).astype(dtype)
    parts = ld1_threads.cut_box((0,) * x.ndim, x.shape, pieces)
    assert len(parts) == min(pieces, shape[0]) > 1
    merged = merge([partial(o, x[sl], x.shape) for o, sl in parts])
    assert finish(merged) == digest_array(x)


def test_a_box_inside_a_leaf_cut_along_its_first_long_axis() -> None:
    """A box of extent 1 on its first axis is cut along the next one; its partial is the
    one-thread partial of the same box."""
    leaf = np.random.default_rng(1).standard_normal((4, 50, 6)).astype(ml_dtypes.bfloat16)
    box = leaf[2:3, 3:47, 1:5]
    parts = ld1_threads.cut_box((2, 3, 1), box.shape, 5)
    assert [o[1] for o, _ in parts] == [3, 11, 20, 29, 38]
    whole = partial((2, 3, 1), box, leaf.shape)
    got = merge([partial(o, box[sl], leaf.shape) for o, sl in parts])
    assert (got.lane1, got.lane2, got.covered) == (whole.lane1, whole.lane2, whole.covered)


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_partial_threaded_equals_partial(threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ld1_threads, "MIN_PIECE_BYTES", 1000)  # small blocks still cut
    x = np.random.default_rng(threads).standard_normal((3001, 3)).astype(np.float32)
    assert ld1_threads.pieces_for(x.nbytes, threads) == threads
    got = ld1_threads.partial_threaded((0, 0), x, x.shape, threads=threads)
    assert finish(got) == digest_array(x)


def test_a_small_block_is_one_piece() -> None:
    assert ld1_threads.pieces_for(ld1_threads.MIN_PIECE_BYTES - 1, 8) == 1
    assert ld1_threads.pieces_for(4 * ld1_threads.MIN_PIECE_BYTES, 8) == 4
    assert ld1_threads.pieces_for(64 * ld1_threads.MIN_PIECE_BYTES, 8) == 8


def test_the_parts_run_on_the_hashing_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    seen: list[str] = []

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(threading.current_thread().name)
        return partial(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ld1_threads, "MIN_PIECE_BYTES", 1000)
    monkeypatch.setattr(ld1_threads, "partial", spy)
    x = np.arange(4000, dtype=np.float32).reshape(1000, 4)
    got = ld1_threads.partial_threaded((0, 0), x, x.shape, threads=4)
    assert finish(got) == digest_array(x)
    assert len(seen) == 4 and all(n.startswith("ckpt-hash") for n in seen)
