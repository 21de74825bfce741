"""``ckpt export`` from a bucket and ``ckpt import`` into one (moto's S3 on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3


def test_export_from_s3_equals_the_local_export(cli: Any, s3: S3, tmp_path: Path) -> None:
    url = s3.fixture("sharded_4x2")
    assert cli("export", url, tmp_path / "remote", "--no-provenance").code == 0
    assert cli("export", FIXTURES / "sharded_4x2", tmp_path / "local", "--no-provenance").code == 0
    remote = (tmp_path / "remote" / "model.safetensors").read_bytes()
    assert remote and remote == (tmp_path / "local" / "model.safetensors").read_bytes()


def test_import_into_s3_restores_like_local(cli: Any, s3: S3, s3_prefix: str, tmp_path: Path) -> None:  # fmt: skip
    assert cli("export", FIXTURES / "seed_mlp", tmp_path / "st", "--params-only").code == 0
    dst = f"s3://{BUCKET}/{s3_prefix}/root"
    r = cli("import", tmp_path / "st", dst, "--step", "500")
    assert r.code == 0, r.stderr
    ls = cli("ls", dst, "--json")
    assert ls.code == 0 and [s["step"] for s in ls.json()["steps"]] == [500]
    diff = cli("diff", f"{FIXTURES / 'seed_mlp'}@500", f"{dst}@500", "--filter", "params.*")
    assert diff.code == 0, diff.stdout + diff.stderr
