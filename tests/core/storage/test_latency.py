"""Latency hidden, shown by counting: commands behind ``tests/support/latency_proxy.py`` (a small delay
per request, in front of the S3 and GCS test servers) keep many requests in flight and make few.

Nothing here times ckpt: the assertions are on the requests the proxy relayed (how many, which
kinds, how many at once, in which order). Wall times are in ``bench/bench_remote.py --latency``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.latency_proxy import LatencyProxy, Request
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, GcsServer, keys, local_files
from tests.support.storage_fixtures import S3

# Request counts and in-flight figures come from moto's in-process server (its hooks).
pytestmark = pytest.mark.moto_only

STEP = FIXTURES / "composite_best" / "2"  # a real Orbax step with metrics: 17 objects
STEPS = 200


def put_steps(s3: S3, prefix: str, n: int) -> str:
    """``n`` copies of a real step as steps 0..n-1 of a root (stored without HTTP)."""
    files = [(rel, p.read_bytes()) for rel, p in local_files(STEP)]
    s3.server.put_objects(
        (f"{prefix}/{step}/{rel}", data) for step in range(n) for rel, data in files
    )
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture(scope="module")
def root_200(moto_s3: S3) -> str:
    return put_steps(moto_s3, "latency/root200", STEPS)


@pytest.fixture
def proxy(s3: S3) -> Iterator[LatencyProxy]:
    with LatencyProxy(s3.server.endpoint, delay=0.02) as p:
        yield p


def most_at_once(log: tuple[Request, ...], kind: str) -> int:
    """The most requests of ``kind`` that were in flight together."""
    events = sorted(
        [(r.started, 1) for r in log if r.kind == kind]
        + [(r.ended, -1) for r in log if r.kind == kind]
    )
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_ls_of_200_steps_keeps_requests_in_flight(
    cli: Any, root_200: str, proxy: LatencyProxy
) -> None:
    result = cli("--s3-endpoint", proxy.endpoint, "ls", root_200, "--json")
    assert result.code == 0, result.stderr
    assert [s["step"] for s in result.json()["steps"]] == list(range(STEPS))
    assert proxy.wait_idle()
    stats = proxy.stats()
    # _CHECKPOINT_METADATA (the commit time prune keeps by) and metrics/metrics of each step,
    # nothing else
    assert stats.by_kind.get("GET") == 2 * STEPS, stats.by_kind
    assert stats.by_kind["LIST"] <= 6  # 2,600 keys: first page, children, 2 ranges at once
    assert stats.max_in_flight >= 16
    assert most_at_once(stats.log, "GET") >= 16
    assert most_at_once(stats.log, "LIST") >= 2


def test_listing_in_ranges_lists_every_key_once(
    cli: Any, s3: S3, root_200: str, proxy: LatencyProxy
) -> None:
    """The parallel listing finds what a plain listing finds (verify reads every step)."""
    from ckpt_cli.core.storage import StorageOptions
    from ckpt_cli.core.storage.bulk import list_parallel
    from ckpt_cli.core.storage.stores import open_store

    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=proxy.endpoint, max_requests=8))
    got = [o.key for o in list_parallel(store, "latency/root200/")]
    assert got == keys(s3.client, "latency/root200/")
    assert len(got) == STEPS * len(list(local_files(STEP)))
    assert proxy.wait_idle()
    assert proxy.stats().by_kind["LIST"] <= 2 + 8


def test_prune_deletes_in_concurrent_batches(
    cli: Any, s3: S3, s3_prefix: str, proxy: LatencyProxy
) -> None:
    url = put_steps(s3, s3_prefix, STEPS)
    result = cli(
        "--s3-endpoint", proxy.endpoint, "prune", url, "--keep-last", "1", "--yes", "--json"
    )
    assert result.code == 0, result.stderr
    assert len(result.json()["outcome"]["deleted"]) == STEPS - 1
    left = keys(s3.client, s3_prefix + "/")
    assert left and all(k.startswith(f"{s3_prefix}/{STEPS - 1}/") for k in left)
    assert len(left) == len(list(local_files(STEP)))
    assert proxy.wait_idle()
    stats = proxy.stats()
    log = stats.log
    # Only the lock is deleted on its own (a single key is one DeleteObject); the steps' objects
    # go in batches: 199 markers (1 batch), 3,184 other objects (4), 199 tombstones (1).
    assert stats.by_kind.get("DELETE", 0) == 1
    assert 4 <= stats.by_kind["DELETE_BATCH"] <= 8
    puts = [r for r in log if r.kind == "PUT"]
    assert len(puts) == STEPS  # 199 tombstones and the lock
    assert most_at_once(log, "PUT") >= 16  # the tombstones go out together
    batches = [r for r in log if r.kind == "DELETE_BATCH"]
    first_delete = min(r.started for r in batches)
    # every step stops looking valid (tombstone put) before anything is deleted
    assert max(r.ended for r in puts if "ckpt-prune.lock" not in r.path) <= first_delete
    # listing: the scan, the re-check and one fresh listing before the deletes, not one per step
    assert stats.by_kind["LIST"] <= 20
    assert stats.requests < 1000  # was 19 per step, one at a time


def test_gcs_prune_uses_the_batch_endpoint(cli: Any, gcs: GcsServer) -> None:
    from tests.support.buckets import upload_gcs

    url = upload_gcs(FIXTURES / "seed_mlp", "latency/gcs-prune")
    with LatencyProxy(gcs.endpoint, delay=0.01) as proxy:
        import os

        old = os.environ.get("TENSORSTORE_GCS_HTTP_URL")
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = proxy.endpoint
        try:
            result = cli("prune", url, "--keep-last", "1", "--yes", "--json")
        finally:
            if old is None:
                os.environ.pop("TENSORSTORE_GCS_HTTP_URL", None)
            else:
                os.environ["TENSORSTORE_GCS_HTTP_URL"] = old
        assert proxy.wait_idle()
        stats = proxy.stats()
    assert result.code == 0, result.stderr
    assert result.json()["outcome"]["deleted"] == ["300", "400"]
    assert stats.by_kind.get("BATCH", 0) >= 2 and stats.by_kind.get("DELETE", 0) == 0
    from ckpt_cli.core.storage.stores import open_store

    left = [o.key for o in open_store("gs", BUCKET).list_objects("latency/gcs-prune/")]
    assert left and all(k.split("/")[2] in ("500", "metadata") for k in left), left
