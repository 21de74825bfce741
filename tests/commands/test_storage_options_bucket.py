"""``--s3-endpoint`` alone (no endpoint in the environment) takes ``import`` into a bucket and
``export`` back out of it, on moto and on SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3

ENDPOINT_VARS = ("CKPT_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def test_import_then_export_with_the_flag_alone(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = cli("export", FIXTURES / "seed_mlp", tmp_path / "st", "--params-only", "--no-provenance")
    assert made.code == 0, made.stderr
    for var in ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    flag = ("--s3-endpoint", s3.endpoint)
    dst = f"s3://{BUCKET}/{s3_prefix}/root"

    r = cli(*flag, "import", tmp_path / "st", dst, "--step", "500", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["written"]["bytes"] > 0
    ls = cli(*flag, "ls", dst, "--json")
    assert ls.code == 0, ls.stderr
    assert [(s["step"], s["status"]) for s in ls.json()["steps"]] == [(500, "committed")]

    same = cli(*flag, "diff", f"{FIXTURES / 'seed_mlp'}@500", f"{dst}@500", "--filter", "params.*")
    assert same.code == 0, same.stdout + same.stderr
    back = cli(*flag, "export", dst, tmp_path / "back", "--no-provenance")
    assert back.code == 0, back.stderr
    want = {p.name: p.read_bytes() for p in (tmp_path / "st").iterdir()}
    assert want and {p.name: p.read_bytes() for p in (tmp_path / "back").iterdir()} == want


def test_completion_of_steps_uses_the_flag(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.completion import complete

    url = s3.fixture("seed_mlp")
    for var in ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)
    line = f"ckpt --s3-endpoint {s3.endpoint} inspect {url} --step "
    assert complete("bash", line) == ["300", "400", "500"]
