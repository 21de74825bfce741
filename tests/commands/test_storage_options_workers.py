"""``--s3-endpoint`` is configuration as data: it reaches the worker processes of
``--workers N`` and the workers of a Dask cluster, whose environment does not name the endpoint
(the S3 test server on 127.0.0.1, started by the tests)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.support.cluster import local_cluster
from tests.support.paths import FIXTURES
from tests.support.storage_fixtures import S3

pytestmark = pytest.mark.slow

ENDPOINT_VARS = ("CKPT_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
MESH = ("--mesh", "data=2,model=2", "--rule", "params.Dense_0.kernel=[null, model]")


@pytest.fixture
def no_endpoint_in_env(s3: S3, monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's endpoint, removed from the environment (workers started now inherit that)."""
    for var in ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    return s3.server.endpoint


def test_s3_endpoint_reaches_local_and_dask_workers(
    cli: Any, s3: S3, s3_prefix: str, no_endpoint_in_env: str
) -> None:
    endpoint = no_endpoint_in_env
    src = s3.fixture("seed_mlp")
    base = src.rsplit("/fx/", 1)[0] + f"/{s3_prefix}"
    assert not any(os.environ.get(v) for v in ENDPOINT_VARS)  # spawned workers see none

    local = cli(
        "--s3-endpoint", endpoint, "reshard", src, f"{base}/local", *MESH,
        "--workers", "2", "--unit-bytes", "4KiB", "--force-split", "--json",
    )  # fmt: skip
    assert local.code == 0, local.stderr
    assert local.json()["scale"]["workers"] == 2 and local.json()["scale"]["units"] > 1

    with local_cluster() as cluster:
        from distributed import Client

        with Client(cluster.scheduler_address) as client:
            seen = client.run(lambda: [os.environ.get(v) for v in ENDPOINT_VARS])
        assert len(seen) == 2 and all(v == [None, None, None] for v in seen.values())
        dask = ("--executor", "dask", "--scheduler", cluster.scheduler_address)
        on_dask = cli(
            "--s3-endpoint", endpoint, "reshard", src, f"{base}/dask", *MESH, *dask,
            "--unit-bytes", "4KiB", "--force-split", "--json",
        )  # fmt: skip
        assert on_dask.code == 0, on_dask.stderr
        assert on_dask.json()["scale"]["executor"] == "dask"
        deep = cli("--s3-endpoint", endpoint, "verify", f"{base}/dask", "--deep", *dask,
                   "--force-split", "--json")  # fmt: skip
        assert deep.code == 0, deep.stdout
        assert deep.json()["problems"] == [] and deep.json()["scale"]["units"] >= 1

    for out in ("local", "dask"):
        same = cli("--s3-endpoint", endpoint, "diff", str(FIXTURES / "seed_mlp"), f"{base}/{out}")
        assert same.code == 0, same.stdout
