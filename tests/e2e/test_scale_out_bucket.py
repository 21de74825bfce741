"""Scale-out against the S3 test server: units read from and write into the bucket on a 2-worker
Dask cluster, and the results equal the single-process run's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import local_cluster
from tests.support.storage_fixtures import S3

# The cluster's workers take the environment (moto's endpoint) when the module starts it.
pytestmark = [pytest.mark.slow, pytest.mark.moto_only]


@pytest.fixture(scope="module")
def s3_cluster(moto_s3: S3) -> Iterator[Any]:
    """A cluster started after the S3 environment is set, so its workers reach the server."""
    with local_cluster() as cluster:
        yield cluster


def test_reshard_migrate_verify_on_dask_in_a_bucket(
    cli: Any, s3: S3, s3_prefix: str, s3_cluster: Any, tmp_path: Path
) -> None:
    src = s3.fixture("seed_mlp")
    base = src.rsplit("/fx/", 1)[0] + f"/{s3_prefix}"
    dask = (
        "--executor",
        "dask",
        "--scheduler",
        s3_cluster.scheduler_address,
        "--unit-bytes",
        "4KiB",
        "--force-split",  # a tiny checkpoint: split although it does not pay
    )
    mesh = ("--mesh", "data=2,model=2", "--rule", "params.Dense_0.kernel=[null, model]")

    single = cli("reshard", src, f"{base}/single", *mesh)
    assert single.code == 0, single.stderr
    scaled = cli("reshard", src, f"{base}/scaled", *mesh, *dask, "--json")
    assert scaled.code == 0, scaled.stderr
    assert scaled.json()["scale"]["workers"] == 2 and scaled.json()["scale"]["units"] > 1
    assert cli("diff", f"{base}/single", f"{base}/scaled").code == 0
    assert cli("diff", src, f"{base}/scaled").code == 0

    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - op: cast\n    match: 'params\\..*'\n    dtype: bfloat16\n")
    one = cli("migrate", src, f"{base}/m-single", "--spec", spec)
    assert one.code == 0, one.stderr
    many = cli("migrate", src, f"{base}/m-scaled", "--spec", spec, *dask)
    assert many.code == 0, many.stderr
    assert cli("diff", f"{base}/m-single", f"{base}/m-scaled").code == 0

    deep = cli("verify", f"{base}/scaled", "--deep", *dask[:4], "--force-split", "--json")
    assert deep.code == 0, deep.stdout
    assert deep.json()["problems"] == [] and deep.json()["scale"]["units"] >= 1
