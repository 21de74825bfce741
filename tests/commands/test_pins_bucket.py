"""Pins in a bucket (the S3 test server): one object per pin, seen by ``ls`` from the listing,
honoured by ``prune``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckpt_cli.core.format.pins import PIN_FILE, pin_step, read_pin, unpin_step
from ckpt_cli.core.storage import open_location
from tests.support.buckets import committed_steps, make_root
from tests.support.remote_servers import BUCKET, keys
from tests.support.storage_fixtures import S3


def test_pin_is_one_object_next_to_the_step_metadata(
    s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    url = s3.put_dir(make_root(tmp_path, range(1, 4)), s3_prefix)
    root = open_location(url)
    result = pin_step(root, 2, "paper", root.list())
    assert result.changed
    key = f"{s3_prefix}/2/{PIN_FILE}"
    assert key in keys(s3.client, s3_prefix + "/")
    body = s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert json.loads(body)["note"] == "paper"
    fresh = open_location(url)
    pin = read_pin(fresh.child("2"))
    assert pin is not None and pin.note == "paper"
    assert unpin_step(fresh, 2, fresh.list()).changed
    assert key not in keys(s3.client, s3_prefix + "/")


def test_prune_in_a_bucket_keeps_the_pinned_step(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    url = s3.put_dir(make_root(tmp_path, range(1, 6)), s3_prefix)
    assert cli("pin", url, "2", "--note", "keep").code == 0
    listing = json.loads(cli("ls", url, "--json").stdout)
    assert {s["step"]: bool(s["pinned"]) for s in listing["steps"]} == {
        1: False,
        2: True,
        3: False,
        4: False,
        5: False,
    }
    r = cli("prune", url, "--keep-last", "1", "--yes", "--json")
    assert r.code == 0, r.stderr
    kept = {k["step"]: k["reasons"] for k in json.loads(r.stdout)["keep"]}
    assert set(kept) == {2, 5} and "pinned: keep" in kept[2]
    assert committed_steps(s3, s3_prefix) == {2, 5}
