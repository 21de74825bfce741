"""A step with an empty no-op item (Kauldron's ``ds_iter``, an empty directory) through a bucket,
which keeps no empty directory: verify does not call it missing there, inspect shows it empty,
and cp and reshard back to local disk make its directory again, so Orbax restores the step."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support import framework_items as fi
from tests.support.remote_servers import BUCKET

pytestmark = pytest.mark.slow


def test_an_empty_item_goes_through_a_bucket_and_back(
    cli: Any, s3: Any, s3_prefix: str, tmp_path: Path
) -> None:
    src = fi.save_run(tmp_path / "run", steps=(1,))
    for marker in src.glob("*/ds_iter/commit_success.txt"):
        marker.unlink()  # empty, as Kauldron's is
    url = f"s3://{BUCKET}/{s3_prefix}/run"
    assert cli("cp", src, url).code == 0
    verified = cli("verify", url, "--deep", "--json")
    assert verified.code == 0 and verified.json()["problems"] == [], verified.stdout
    assert {n["item"] for n in verified.json()["notes"]} == {"1/ds_iter", "1/blob"}
    shown = cli("inspect", url, "--item", "ds_iter", "--json")
    assert shown.code == 0 and shown.json()["kind"] == "empty", shown.stderr
    back, resharded = tmp_path / "back", tmp_path / "resharded"
    assert cli("cp", url, back).code == 0
    assert cli("reshard", url, resharded, "--mesh", "data=1").code == 0
    for out in (back, resharded):
        assert (out / "1" / "ds_iter").is_dir() and not any((out / "1" / "ds_iter").iterdir())
        got = fi.restore_step(out, 1)
        assert got["ds_iter"] == "restored-by-noop" and got["blob"] == fi.BLOB
    shutil.rmtree(back)
