"""``ckpt diff`` of an Orbax step in a bucket against its local safetensors export (S3 servers
started by the tests: moto and SeaweedFS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.paths import FIXTURES, REPO
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3

SPEC = REPO / "examples" / "mlp_to_pytorch.yaml"


def test_a_step_in_a_bucket_against_its_local_export(cli: Any, s3: S3, tmp_path: Path) -> None:
    url = s3.fixture("seed_mlp")
    out = tmp_path / "pt"
    assert cli("export", FIXTURES / "seed_mlp", out, "--spec", SPEC).code == 0
    r = cli("diff", url, out, "--spec", SPEC, "--json")
    assert r.code == 0, r.stdout + r.stderr
    doc = r.json()
    assert doc["a"]["path"].startswith(f"s3://{BUCKET}/") and doc["a"]["step"] == 500
    assert len(doc["leaves"]) == 4 and all(x["status"] == "equal" for x in doc["leaves"])
    older = cli("diff", f"{url}@400", out, "--spec", SPEC, "--json")
    assert older.code == 1 and older.json()["summary"]["different"] == 4
    # Safetensors sides are read locally: a bucket URL is refused in one line.
    r = cli("diff", url, f"s3://{BUCKET}/fx/model.safetensors")
    assert r.code == 3 and "local safetensors files only" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
