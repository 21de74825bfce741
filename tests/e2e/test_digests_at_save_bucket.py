"""The trainer's record in a bucket: a step saved through ``ckpt_cli.orbax``'s
``DigestingCheckpointManager`` (async ``Composite`` save on a (4, 2) mesh), written locally (an
``s3://`` CheckpointManager goes through etils' epath, which needs s3fs: not installed here,
"ImportError: Install s3fs to access S3"), ``ckpt cp`` to an S3 bucket (moto and SeaweedFS), and
``ckpt verify --deep s3://...`` checks the values there against the trainer's record with no
``--record`` pass; a byte flipped before a copy is caught in the bucket."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import savetime
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3

pytestmark = pytest.mark.slow
STEP = savetime.SAVED_STEP


def _checked(cli: Any, url: str) -> dict[str, str]:
    r = cli("verify", url, "--deep", "--json")
    assert r.code == 0, r.stdout + r.stderr
    digests = r.json()["checked"]["digests"]
    assert isinstance(digests, dict) and digests
    return {path.rsplit("/", 1)[-1]: status for path, status in digests.items()}


def test_trainer_record_is_checked_in_a_bucket(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    savetime.train_and_save(run)
    record = savetime.recorded(run / str(STEP) / "state")
    assert record == savetime.digested(run, STEP, "state")
    url = f"s3://{BUCKET}/{s3_prefix}/run"
    copied = cli("cp", run, url, "--verify", "--json")
    assert copied.code == 0, copied.stderr
    # The trainer's record holds values, not file checksums: cp cannot check those files and
    # says so; the JSON item's record has its file's checksum, checked on the way.
    assert copied.json()["outcome"]["unverified_items"] == [f"{STEP}/state"]
    assert copied.json()["outcome"]["verified_objects"] > 0
    checked = _checked(cli, url)  # the trainer's records, in the bucket
    assert checked == {"state": "checked", "meta": "checked"}, checked
    printed = cli("digest", url, "--step", str(STEP), "--json")
    assert printed.code == 0, printed.stderr
    [state] = [it for it in printed.json()["items"] if it["item"] == "state"]
    assert {x["name"]: x["digest"] for x in state["leaves"]} == record

    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    changed = savetime.flip_a_byte(damaged, STEP, "state", record)
    assert changed
    [meta] = [p for p in (damaged / str(STEP) / "meta").iterdir() if '"lr"' in p.read_text()]
    meta.write_text(meta.read_text().replace("0.", "9.", 1))  # the JSON item's value changed
    bad = f"s3://{BUCKET}/{s3_prefix}/damaged"
    assert cli("cp", damaged, bad).code == 0
    r = cli("verify", bad, "--deep", "--json")
    assert r.code == 1, r.stdout
    assert any(name in r.stdout for name in changed)
    assert f"{STEP}/meta" in r.stdout  # the JSON item against the checksum of its file
