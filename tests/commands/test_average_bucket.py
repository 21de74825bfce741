"""``ckpt average`` with buckets on both S3 servers (moto and SeaweedFS): local steps averaged
into a bucket, a bucket's steps averaged into another bucket path and back to local disk. Each
output equals the local average (``ckpt diff``), passes ``verify --deep`` in the bucket, and,
downloaded, restores with real Orbax to numpy's mean of the restored steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.average_runs import flat, restore_raw, weighted
from tests.support.buckets import committed_steps, step_dirs
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, download
from tests.support.storage_fixtures import S3

SRC = FIXTURES / "seed_mlp"
STEPS = ("--steps", "300,400,500", "--weights", "1,1,2")


def test_average_into_out_of_and_between_buckets(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    assert cli("average", SRC, local, *STEPS).code == 0
    up = f"s3://{BUCKET}/{s3_prefix}/up"
    r = cli("average", SRC, up, *STEPS, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"] == f"{up}/500"
    assert committed_steps(s3, f"{s3_prefix}/up") == {500}
    assert ".ckpt-writing" not in step_dirs(s3, f"{s3_prefix}/up")["500"]
    verified = cli("verify", up, "--deep", "--json")
    assert verified.code == 0 and verified.json()["summary"] == {"errors": 0, "warnings": 0}
    assert cli("diff", local, up).code == 0
    src = s3.put_dir(SRC, f"{s3_prefix}/src")
    across = f"s3://{BUCKET}/{s3_prefix}/across"
    assert cli("average", src, across, *STEPS).code == 0, "bucket -> bucket"
    back = tmp_path / "back"
    assert cli("average", src, back, *STEPS).code == 0, "bucket -> local"
    assert cli("diff", local, across).code == 0 and cli("diff", local, back).code == 0
    steps = [flat(restore_raw(SRC, s)) for s in (300, 400, 500)]
    for restored_from in (download(s3.client, f"{s3_prefix}/across", tmp_path / "dl"), back):
        got = flat(restore_raw(restored_from, 500))
        assert got.keys() == steps[-1].keys()
        kernel = weighted([s["params.Dense_0.kernel"] for s in steps], [1, 1, 2])
        np.testing.assert_allclose(got["params.Dense_0.kernel"], kernel, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(
            got["opt_state.0.mu.Dense_0.kernel"], steps[-1]["opt_state.0.mu.Dense_0.kernel"]
        )
        assert int(got["step"]) == int(steps[-1]["step"])


def test_a_missing_step_in_a_bucket_writes_nothing(cli: Any, s3: S3, s3_prefix: str) -> None:
    src = s3.put_dir(SRC, f"{s3_prefix}/src")
    out = f"s3://{BUCKET}/{s3_prefix}/out"
    r = cli("average", src, out, "--steps", "300,450")
    assert r.code == 3 and "step 450 not found" in r.stderr
    assert step_dirs(s3, f"{s3_prefix}/out") == {}
