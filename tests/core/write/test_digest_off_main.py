"""The writers take each block's ``ld1`` on the hashing pool while the main thread goes on
reading and writing (``Pipeline._digest``): taken on the main thread, a reshard of 128 MiB
chunks to (2, 4) on the 13-core host spent 3.4 of its 4.2 s there."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.digest import ld1, ld1_threads
from ckpt_cli.core.write.pipeline import Pipeline
from ckpt_cli.errors import SourceDigestError
from tests.support.paths import FIXTURES

ROWS, COLS = 256, 512
CHUNK = (128, 128)  # output chunks that cut the rows: every block is a box of strided runs


def _pipeline(values: np.ndarray, expect: str) -> Pipeline:
    import tensorstore as ts

    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    def source(region: tuple[slice, ...]) -> np.ndarray:
        return values[region].copy()

    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("float32", (ROWS, COLS), CHUNK, zarr3=False),
        source=source,  # type: ignore[arg-type]
        fresh_blocks=True,
    )

    def open_array(_: LeafOut) -> Any:
        spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": list(CHUNK)}}
        return ts.open(spec, create=True, dtype=ts.float32, shape=[ROWS, COLS])

    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=1 << 30,
        finite_label=None,
        slab_reads=False,
        open_array=open_array,
        dest="memory://",
    )
    regions = [
        (slice(r, r + CHUNK[0]), slice(c, c + CHUNK[1]))
        for r in range(0, ROWS, CHUNK[0])
        for c in range(0, COLS, CHUNK[1])
    ]
    return Pipeline(writer, [(leaf, regions)], None, {"w": expect})  # type: ignore[arg-type]


@pytest.fixture
def hashed_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads each block's partial was taken on."""
    names: list[str] = []
    real = ld1.partial

    def recorded(*a: Any, **k: Any) -> ld1.Partial:
        names.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(ld1, "partial", recorded)
    monkeypatch.setattr(ld1_threads, "partial", recorded)  # bound there at its import
    monkeypatch.setattr(threads, "_chosen", 4)
    return names


def test_each_blocks_digest_is_taken_on_the_hashing_pool(hashed_on: list[str]) -> None:
    values = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    pipe = _pipeline(values, ld1.digest_array(values))
    hashed_on.clear()  # digest_array's own partial, taken here
    pipe.run()  # the digest of the blocks written matches: no error
    assert len(hashed_on) == (ROWS // CHUNK[0]) * (COLS // CHUNK[1])
    assert all(name.startswith("ckpt-hash") for name in hashed_on), hashed_on


def test_a_damaged_block_still_fails_the_run(hashed_on: list[str]) -> None:
    values = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype(np.float32)
    want = ld1.digest_array(values)
    values[200, 300] += 1.0  # one value in the last row band, in the third column block
    with pytest.raises(SourceDigestError, match="the source is damaged"):
        _pipeline(values, want).run()
    assert hashed_on


def test_export_takes_its_blocks_partials_off_the_main_thread(
    hashed_on: list[str], tmp_path: Path
) -> None:
    """``export`` writes each tensor's ld1 into the files: the blocks it reads whole (small
    tensors) have their partials taken on the hashing pool while the next blocks are read."""
    import ckpt_cli

    ckpt_cli.execute(ckpt_cli.plan_export(FIXTURES / "seed_mlp", tmp_path / "pt"))
    assert hashed_on
    assert all(name.startswith("ckpt-hash") for name in hashed_on), hashed_on
    assert ckpt_cli.verify(tmp_path / "pt", deep=True).ok


def test_a_block_over_the_bound_is_hashed_at_once(
    hashed_on: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block larger than ``LATER_MAX_BYTES`` is not left to one pool thread: it is hashed
    before its write starts (in parts on the pool where it is large enough for them)."""
    from ckpt_cli.core.digest import records

    monkeypatch.setattr(records, "LATER_MAX_BYTES", 32 << 10)  # the blocks here: 64 KiB
    values = np.random.default_rng(2).standard_normal((ROWS, COLS)).astype(np.float32)
    pipe = _pipeline(values, ld1.digest_array(values))
    hashed_on.clear()
    pipe.run()
    assert len(hashed_on) == (ROWS // CHUNK[0]) * (COLS // CHUNK[1])
    assert set(hashed_on) == {"MainThread"}  # 64 KiB: one part, taken by the caller
