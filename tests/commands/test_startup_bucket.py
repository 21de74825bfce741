"""``ls`` and ``inspect`` of a bucket read metadata with the listing's HTTP client: they import
neither TensorStore nor ml_dtypes nor numpy (1-1.5 s of imports), nor jax or orbax."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.buckets import upload_gcs
from tests.support.paths import FIXTURES
from tests.support.remote_servers import GcsServer
from tests.support.startup_probe import PROBE
from tests.support.storage_fixtures import S3

HEAVY = ("tensorstore", "ml_dtypes", "numpy", "jax", "jaxlib", "orbax", "keras")

#: The probe of test_startup.py, reporting every heavy module loaded at exit.
PROBE_ALL = PROBE.replace('("jax", "jaxlib", "orbax", "flax", "keras")', repr(HEAVY))


def _heavy_modules(args: list[str]) -> tuple[list[str], str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_ALL, json.dumps(args)], capture_output=True, text=True
    )
    line = next((x for x in proc.stderr.splitlines() if x.startswith("HEAVY=")), None)
    assert line is not None, proc.stderr
    return json.loads(line[len("HEAVY=") :]), proc.stdout


@pytest.mark.parametrize(
    ("fixture", "args"),
    [
        ("seed_mlp", ["ls"]),
        ("seed_mlp", ["ls", "--json"]),
        ("composite_best", ["ls", "--json"]),
        ("no_ocdbt", ["inspect"]),
        ("no_ocdbt", ["inspect", "--json"]),
        ("no_ocdbt_zarr3", ["inspect", "--json"]),
        ("seed_mlp", ["inspect"]),
        ("sharded_4x2", ["inspect", "--json"]),
        ("v1_zarr3", ["inspect", "--json"]),
        ("unmerged_ocdbt", ["inspect", "--json"]),
    ],
)
def test_bucket_reads_import_no_array_library(s3: S3, fixture: str, args: list[str]) -> None:
    url = s3.fixture(fixture)
    heavy, out = _heavy_modules([args[0], url, *args[1:]])
    assert out  # the command ran and printed its answer
    if "--json" in args:
        doc = json.loads(out)
        assert doc.get("steps") or doc.get("leaves")
    assert heavy == []


def test_gs_reads_import_no_array_library(gcs: GcsServer) -> None:
    url = upload_gcs(FIXTURES / "seed_mlp", "startup/seed_mlp")
    for args in (["ls", url, "--json"], ["inspect", url, "--json"]):
        heavy, out = _heavy_modules(args)
        assert json.loads(out)
        assert heavy == [], args
