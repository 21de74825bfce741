"""``ckpt trend`` on a bucket (moto and SeaweedFS): the same document as on the local copy, for
the fixture layouts and for a real training run with a NaN, read here and by worker processes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.buckets import normalized
from tests.support.paths import FIXTURES
from tests.support.storage_fixtures import S3
from tests.support.trend_runs import NAN_LEAF, NAN_STEP, TrendRuns

LAYOUTS = ["seed_mlp", "composite_best", "no_ocdbt_zarr3", "unmerged_ocdbt", "sharded_4x2"]


def _same(cli: Any, local: str, url: str, *args: str) -> dict[str, Any]:
    a = cli("trend", local, *args, "--json")
    b = cli("trend", url, *args, "--json")
    assert a.code == b.code, (a.stderr, b.stderr)
    doc = b.json()
    assert normalized(a.json(), local, url) == doc
    return doc


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_bucket_gives_the_local_document(cli: Any, s3: S3, name: str) -> None:
    item = ("--item", "state") if name == "composite_best" else ()
    doc = _same(cli, str(FIXTURES / name), s3.fixture(name), *item)
    assert doc["leaves"] and doc["steps"]


def test_a_run_in_a_bucket_names_its_nan(cli: Any, s3: S3, trend_runs: TrendRuns) -> None:
    url = s3.put_dir(trend_runs.diverged, "trend-diverged")
    doc = _same(cli, str(trend_runs.diverged), url)
    assert (doc["findings"][0]["leaf"], doc["findings"][0]["step"]) == (NAN_LEAF, NAN_STEP)
    assert cli("trend", url, "--check").code == 1


@pytest.mark.slow
def test_workers_read_a_bucket_into_the_local_document(
    cli: Any, s3: S3, trend_runs: TrendRuns
) -> None:
    """Two local worker processes reading the run from the bucket in units of leaves: the
    document of one process reading the local copy (every figure to the bit)."""
    url = s3.put_dir(trend_runs.diverged, "trend-workers")
    local = cli("trend", trend_runs.diverged, "--json")
    scaled = cli("trend", url, "--workers", "2", "--force-split", "--unit-bytes", "4KiB", "--json")
    assert local.code == scaled.code == 0, scaled.stderr
    doc = scaled.json()
    scale = doc.pop("scale")
    assert scale["workers"] == 2 and scale["units"] > 1 and scale["split"]
    want = normalized(local.json(), str(trend_runs.diverged), url)
    assert want.pop("scale") is None
    assert doc == want
    assert (doc["findings"][0]["leaf"], doc["findings"][0]["step"]) == (NAN_LEAF, NAN_STEP)
