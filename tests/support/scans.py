"""Scanning an inspected item's leaves in tests of ``format/scan.py``: every leaf with its
``ld1`` (and SHA-256 when asked), and a count of the streaming jobs a scan runs."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.format import scan
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.resolve import resolve_items
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.storage import open_location
from tests.support.ldigest_reference import reference_digest
from tests.support.sharded import read_values


def scan_report(report: Any, budget: int, digest: bool = False) -> dict[str, scan.LeafScan]:
    """Every array leaf of ``report`` scanned at ``budget``, by name."""
    store = ItemStore(report.ref.location, report.zarr_format == 3)
    tasks = [
        scan.ScanTask(x.name, x.array, x.database, digest=digest, ld1=True)
        for x in report.leaves
        if x.array is not None
    ]
    assert tasks
    return {s.name: s for s in scan.scan_leaves(store, tasks, budget)}


def count_stream_jobs(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Streaming jobs (``scan._stream_leaf``) run from now on, by leaf."""
    jobs: Counter[str] = Counter()
    lock = threading.Lock()
    real = scan._stream_leaf

    def counted(acc: Any, slabs: Any, flight: Any) -> None:
        with lock:
            jobs[acc.task.name] += 1
        real(acc, slabs, flight)

    monkeypatch.setattr(scan, "_stream_leaf", counted)
    return jobs


def save_on_mesh(root: Path, values: dict[str, tuple[Any, Any]]) -> tuple[Any, dict[str, Any]]:
    """``values`` (name -> (array, PartitionSpec)) saved by Orbax's ``StandardSave`` from a
    (4, 2) mesh ("data", "model") of 8 forced CPU devices as step 0 of ``root``: the item's
    inspection and its values read back."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    state = {
        k: jax.device_put(jnp.asarray(x), NamedSharding(mesh, p)) for k, (x, p) in values.items()
    }
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(0, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    report = inspect_item(resolve_items(open_location(str(root)), None)[0])
    return report, read_values(root / "0")


def assert_scans_match(scans: dict[str, scan.LeafScan], values: dict[str, Any]) -> None:
    """Every leaf scanned whole, without error: its ``ld1`` the reference's, its NaN and Inf
    counts and its bytes those of its values."""
    import numpy as np

    assert scans.keys() == values.keys()
    for name, s in scans.items():
        x = values[name]
        assert s.error is None and s.complete, name
        assert scan.ld1_of(s) == reference_digest(x), name
        wide = np.asarray(x, dtype=np.float64) if x.dtype.kind in "fV" else np.zeros(1)
        assert (s.nan, s.inf) == (int(np.isnan(wide).sum()), int(np.isinf(wide).sum())), name
        assert s.bytes == x.nbytes, name
