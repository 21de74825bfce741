"""Blocks TensorStore reads are counted and hashed on the scan's pool (``scan._take_block``):
each block's NaN/Inf counts and ``ld1`` partial in an ``Acc`` of its own, which the leaf's
absorbs in submission order, so the counting runs on every thread, not on the one that takes
the blocks; a SHA-256 (values in order) keeps it on that thread. Either way the same counts and
digests. ``bfloat16`` blocks are checked for NaN/Inf by their bits."""

from __future__ import annotations

import hashlib
import math
import threading
from collections import Counter
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.format import scan, scan_acc
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.dtypes import all_finite
from ckpt_cli.errors import StorageError
from tests.support.ldigest_reference import reference_digest
from tests.support.scans import (
    assert_scans_match,
    count_stream_jobs,
    save_on_mesh,
    scan_report,
)

#: Larger than every chunk of the fixture (none streams: every block is a TensorStore read),
#: smaller than every leaf but ``one`` (each is several blocks).
BUDGET = 4096

#: bfloat16 bit patterns: -NaN (quiet and signalling), +NaN, -Inf, +Inf, then finite ones.
NON_FINITE_BITS = (0xFFC1, 0xFF81, 0x7FC0, 0xFF80, 0x7F80)
FINITE_BITS = (0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x0000, 0x8000, 0x3F80)


def _bf16(bits: list[int], shape: tuple[int, ...]) -> Any:
    return np.array(bits, dtype=np.uint16).reshape(shape).view(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    """Orbax on 8 forced CPU devices: ``rows`` float32 in 8 chunks of 1.5 KiB with a NaN and
    two Infs, ``half`` bfloat16 in 8 chunks with -NaN, -Inf and +Inf, ``ints`` int32 in a
    4 x 2 grid, ``one`` one small chunk."""
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(23)
    rows = rng.standard_normal((64, 48)).astype(np.float32)
    rows[3, 5], rows[20, 1], rows[60, 0] = np.nan, -np.inf, np.inf
    half = rng.standard_normal((128, 32)).astype(ml_dtypes.bfloat16)
    bits = half.view(np.uint16)
    bits[7, 3], bits[70, 0], bits[127, 31] = 0xFFC1, 0xFF80, 0x7F80  # -NaN, -Inf, +Inf
    values = {
        "rows": (rows, P(("data", "model"), None)),
        "half": (half, P(("data", "model"), None)),
        "ints": (rng.integers(-9, 9, (32, 64)).astype(np.int32), P("data", "model")),
        "one": (rng.standard_normal((3, 7)).astype(np.float32), P()),
    }
    report, read = save_on_mesh(tmp_path_factory.mktemp("blocks") / "root", values)
    grids = {x.name: x.array.chunk_grid for x in report.leaves if x.array is not None}
    assert grids == {"rows": (8, 1), "half": (8, 1), "ints": (4, 2), "one": (1, 1)}
    return report, read


def _scan(report: Any, digest: bool = False, budget: int = BUDGET) -> dict[str, scan.LeafScan]:
    return scan_report(report, budget, digest)


def _adds(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """``Acc.add`` calls by the thread that made them (the scan's pool or not)."""
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    real = scan_acc.Acc.add

    def counted(self: Any, block: Any, origin: tuple[int, ...]) -> None:
        name = threading.current_thread().name
        with lock:
            calls["pool" if name.startswith("ckpt-stream") else name] += 1
        real(self, block, origin)

    monkeypatch.setattr(scan_acc.Acc, "add", counted)
    return calls


@pytest.mark.parametrize("n", [1, 4])
def test_blocks_are_counted_on_the_pool_with_the_same_results(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", n)
    adds = _adds(monkeypatch)
    scans = _scan(report)
    assert set(adds) == {"pool"} and adds["pool"] > len(values)  # several blocks a leaf
    assert_scans_match(scans, values)
    assert (scans["rows"].nan, scans["rows"].inf) == (1, 2)
    assert (scans["half"].nan, scans["half"].inf) == (1, 2)
    assert scans["rows"].blocks == 4  # two 1.5 KiB chunks a 4 KiB block: each absorbed once


def test_a_sha256_counts_on_the_taking_thread(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SHA-256 needs the blocks in order: taken and hashed where they are taken, with the
    same counts and ``ld1`` as the pool's route."""
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    pooled = _scan(report)
    adds = _adds(monkeypatch)
    scans = _scan(report, digest=True)
    assert adds and "pool" not in adds
    for name, s in scans.items():
        want = hashlib.sha256(np.ascontiguousarray(values[name]).tobytes()).hexdigest()
        assert s.digest == want, name
        assert (s.nan, s.inf, s.blocks) == (
            pooled[name].nan,
            pooled[name].inf,
            pooled[name].blocks,
        ), name
        assert scan.ld1_of(s) == scan.ld1_of(pooled[name]) == reference_digest(values[name])


def test_a_failed_block_fails_its_leaf_only(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    real = scan.read_block

    def broken(reader: Any, sl: Any) -> Any:
        if reader.info.shape == (128, 32) and sl[0].start == 64:
            raise StorageError("block at row 64 cannot be read")
        return real(reader, sl)

    monkeypatch.setattr(scan, "read_block", broken)
    scans = _scan(report)
    assert scans["half"].error == "block at row 64 cannot be read"
    assert scan.ld1_of(scans["half"]) is None
    for name in ("rows", "ints", "one"):
        assert scans[name].error is None, name
        assert scan.ld1_of(scans[name]) == reference_digest(values[name]), name


@pytest.mark.parametrize(("budget", "streamed"), [(1536, True), (1537, False)])
def test_a_chunk_that_fills_a_block_streams(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, budget: int, streamed: bool
) -> None:
    """``rows``' chunks are 1,536 bytes: at that budget each is a block of its own and streams
    from its file (a job a chunk); at one byte more TensorStore reads them (its blocks)."""
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    jobs = count_stream_jobs(monkeypatch)
    scans = _scan(report, budget=budget)
    assert jobs["rows"] == (8 if streamed else 0)
    assert scans["rows"].blocks == 8  # a chunk a block either way
    assert scan.ld1_of(scans["rows"]) == reference_digest(values["rows"])
    assert (scans["rows"].nan, scans["rows"].inf) == (1, 2)


def test_other_streaming_callers_leave_a_budget_sized_chunk_to_tensorstore(
    saved: tuple[Any, dict[str, Any]],
) -> None:
    """``streamed_slabs`` streams a chunk of exactly the budget only for the scan
    (``at_budget``); ``diff``, which streams a pair on one thread, keeps TensorStore's
    parallel reads for it, and streams a chunk over the budget as before."""
    report, values = saved
    store = ItemStore(report.ref.location, report.zarr_format == 3)
    rows = next(x for x in report.leaves if x.name == "rows")
    task = scan.ScanTask(rows.name, rows.array, rows.database)
    ((_, reader),) = list(scan.open_readers(store, [task]))
    assert scan.streamed_slabs(rows.array, reader, 1536) is None
    assert scan.streamed_slabs(rows.array, reader, 1535) is not None
    slabs = scan.streamed_slabs(rows.array, reader, 1536, at_budget=True)
    assert slabs is not None
    got = np.concatenate([v for _, v in slabs])
    np.testing.assert_array_equal(got, values["rows"])


@pytest.mark.parametrize("bad", NON_FINITE_BITS)
def test_bfloat16_non_finite_found_by_its_bits(bad: int) -> None:
    """Every NaN and Inf, of either sign, in a contiguous block and a strided view; finite
    extremes (largest, smallest subnormal, signed zeros) are not."""
    finite = _bf16([FINITE_BITS[i % len(FINITE_BITS)] for i in range(48)], (6, 8))
    assert all_finite(finite) and bool(np.isfinite(finite).all())
    block = finite.copy()
    block.view(np.uint16)[4, 6] = bad
    assert not math.isfinite(float(block[4, 6]))
    assert not all_finite(block)
    assert not all_finite(block[::2, ::3])  # row 4, column 6: in the view
    assert all_finite(block[1::2, :])  # row 4 left out
