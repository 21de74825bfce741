"""Damaged items on a bucket: ``inspect`` reads their metadata without TensorStore where it can
(``format/headers.py``) and gives way to TensorStore where the bytes are not what they should be,
so that it answers as it does on disk: the same exit code, the same document when it succeeds."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.remote.conftest import S3
from tests.remote.test_remote_read import normalized

DAMAGED = FIXTURES.parent / "damaged"
NAMES = sorted(
    p.name for p in DAMAGED.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
)


@pytest.mark.parametrize("name", NAMES)
def test_inspect_of_a_damaged_item_answers_as_on_disk(
    cli: Any, s3: S3, s3_prefix: str, name: str
) -> None:
    assert NAMES
    local = str(DAMAGED / name)
    url = s3.put_dir(DAMAGED / name, f"{s3_prefix}/{name}")
    a = cli("inspect", local, "--json")
    b = cli("inspect", url, "--json")
    assert a.code == b.code, (a.stderr, b.stderr)
    if a.code == 0:
        assert normalized(b.json(), "", "") == normalized(a.json(), local, url)
    else:
        assert b.json()["error"]["code"] == a.json()["error"]["code"]
