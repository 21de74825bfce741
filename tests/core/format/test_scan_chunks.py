"""A streamed leaf of many chunks is read by a job a chunk (``scan._stream_jobs``), so the chunks
of one large leaf decode on every thread: each job's counts and ``ld1`` partial, taken into the
leaf's, give what one job gives, whatever the chunks' alignment or grid; a SHA-256 keeps one job."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.format import scan
from ckpt_cli.errors import StorageError
from tests.support.ldigest_reference import reference_digest
from tests.support.scans import (
    assert_scans_match,
    count_stream_jobs,
    save_on_mesh,
    scan_report,
)

#: Every chunk of the fixture is larger than this: all of them stream.
BUDGET = 16


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    """Orbax on 8 forced CPU devices, mesh (4, 2): ``rows`` in 8 chunks of 8 rows (each starts
    at a word), ``odd`` in 8 chunks of 18 bytes (most start inside a word), ``grid`` a 4 x 2
    grid of chunks (no chunk is one run of the leaf), ``repl`` replicated (Orbax writes it in
    8 chunks of 20 bytes), ``one`` a single chunk."""
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(11)
    rows = rng.standard_normal((64, 48)).astype(np.float32)
    rows[3, 5], rows[20, 1], rows[60, 0] = np.nan, -np.inf, np.inf  # chunks 0, 2 and 7
    values = {
        "rows": (rows, P(("data", "model"), None)),
        "odd": (rng.standard_normal((24, 3)).astype(np.float16), P(("data", "model"), None)),
        "grid": (rng.standard_normal((16, 8)).astype(np.float32), P("data", "model")),
        "repl": (rng.standard_normal(40).astype(np.float32), P()),
        "one": (rng.standard_normal((3, 7)).astype(np.float32), P()),
    }
    report, read = save_on_mesh(tmp_path_factory.mktemp("chunks") / "root", values)
    grids = {x.name: x.array.chunk_grid for x in report.leaves if x.array is not None}
    assert grids == {"rows": (8, 1), "odd": (8, 1), "grid": (4, 2), "repl": (8,), "one": (1, 1)}
    return report, read


def _scan(report: Any, digest: bool = False) -> dict[str, scan.LeafScan]:
    return scan_report(report, BUDGET, digest)


def test_a_leaf_of_many_chunks_streams_a_job_a_chunk(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report, _ = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    jobs = count_stream_jobs(monkeypatch)
    scans = _scan(report)
    assert dict(jobs) == {"rows": 8, "odd": 8, "grid": 8, "repl": 8, "one": 1}
    assert list(scans) == ["grid", "odd", "one", "repl", "rows"]  # each once, in task order
    assert all(s.error is None and s.complete for s in scans.values())


@pytest.mark.parametrize("n", [1, 4])
def test_chunk_jobs_give_the_leafs_digest_and_counts(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", n)
    scans = _scan(report)
    assert scans.keys() == {"rows", "odd", "grid", "repl", "one"}
    assert_scans_match(scans, values)
    assert (scans["rows"].nan, scans["rows"].inf) == (1, 2)
    assert scans["rows"].blocks == 64 * 12  # 16-byte slabs, 12 a row, over the 8 jobs


def test_a_sha256_keeps_the_leaf_one_job(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SHA-256 needs the values in order: the leaves cut along rows stream as one job (the
    2-D grid is not streamed at all: chunk after chunk is not its C order)."""
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    jobs = count_stream_jobs(monkeypatch)
    scans = _scan(report, digest=True)
    assert dict(jobs) == {"rows": 1, "odd": 1, "repl": 1, "one": 1}
    for name in ("rows", "odd", "grid", "repl"):
        want = hashlib.sha256(np.ascontiguousarray(values[name]).tobytes()).hexdigest()
        assert scans[name].digest == want, name
        assert scan.ld1_of(scans[name]) == reference_digest(values[name]), name


def test_a_failed_chunk_job_fails_its_leaf_only(
    saved: tuple[Any, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report, values = saved
    monkeypatch.setattr(threads, "_chosen", 4)
    real = scan.chunk_slabs

    def broken(*args: Any, chunks: Any = None) -> Any:
        if chunks == ((5, 0),) and args[2].shape == (64, 48):
            raise StorageError("chunk 5.0 cannot be read")
        yield from real(*args, chunks=chunks)

    monkeypatch.setattr(scan, "chunk_slabs", broken)
    scans = _scan(report)
    assert scans["rows"].error == "chunk 5.0 cannot be read"
    assert scan.ld1_of(scans["rows"]) is None
    for name in ("odd", "grid", "repl", "one"):
        assert scans[name].error is None
        assert scan.ld1_of(scans[name]) == reference_digest(values[name]), name
