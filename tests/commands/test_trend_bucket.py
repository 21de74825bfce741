"""``ckpt trend`` on a bucket (moto and SeaweedFS): the same document as on the local copy, for
the fixture layouts and for a real training run with a NaN."""

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
