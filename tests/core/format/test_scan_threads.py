"""``scan_leaves`` streams leaves of large chunks as jobs on a pool of ``threads()`` threads:
several such leaves are read at once, and the results are those of one thread."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.format import scan
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.resolve import resolve_items
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.storage import open_location


@pytest.fixture(scope="module")
def item(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three leaves of one 6 MiB chunk each (above the 4 MiB read budget: streamed)."""
    import orbax.checkpoint as ocp

    root = tmp_path_factory.mktemp("scan") / "root"
    rng = np.random.default_rng(5)
    state = {f"w{i}": rng.standard_normal((1536, 1024), dtype=np.float32) for i in range(3)}
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(0, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return inspect_item(resolve_items(open_location(str(root)), None)[0])


def _scan(report: Any) -> list[scan.LeafScan]:
    store = ItemStore(report.ref.location, report.zarr_format == 3)
    tasks = [
        scan.ScanTask(x.name, x.array, x.database, ld1=True)
        for x in report.leaves
        if x.array is not None
    ]
    return list(scan.scan_leaves(store, tasks))


def test_large_chunk_leaves_stream_at_once(item: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs meet at a barrier: they can only if they run at the same time."""
    monkeypatch.setattr(threads, "_chosen", 2)
    barrier = threading.Barrier(2, timeout=60)
    real = scan._stream_leaf
    met: list[str] = []

    def meet(acc: Any, slabs: Any, flight: Any) -> None:
        if acc.task.name in ("w0", "w1"):
            barrier.wait()
            met.append(threading.current_thread().name)
        real(acc, slabs, flight)

    monkeypatch.setattr(scan, "_stream_leaf", meet)
    scans = _scan(item)
    assert [s.name for s in scans] == ["w0", "w1", "w2"]  # in task order
    assert len(met) == 2 and all(n.startswith("ckpt-stream") for n in met)
    assert all(s.error is None and s.blocks > 1 for s in scans)


def test_the_same_scans_at_1_and_4_threads(item: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    got = []
    for n in (1, 4):
        monkeypatch.setattr(threads, "_chosen", n)
        got.append([(s.name, s.nan, s.inf, s.bytes, scan.ld1_of(s)) for s in _scan(item)])
    assert got[0] == got[1]
    assert all(ld1 and ld1.startswith("ld1:") for *_, ld1 in got[0])


@pytest.mark.parametrize(("n", "count", "limit_mib"), [(1, 8, 32), (4, 8, 32), (13, 26, 104)])
def test_reads_in_flight_follow_the_threads(
    item: Any, monkeypatch: pytest.MonkeyPatch, n: int, count: int, limit_mib: int
) -> None:
    """Two blocks of the 4 MiB budget per thread, never under the one-thread window; a
    streaming job counts as a read but holds no bytes of the window."""
    monkeypatch.setattr(threads, "_chosen", n)
    seen: list[Any] = []
    real = scan._InFlight

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen.append(self)

    monkeypatch.setattr(scan, "_InFlight", Spy)
    _scan(item)
    (flight,) = seen
    assert (flight.count, flight.limit) == (count, limit_mib << 20)
    assert flight.bytes == 0 and not flight.pending
