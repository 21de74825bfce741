"""``tests/support/moto_server.py``: moto with ranged GETs that read only their range, same answers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.moto_server import spawn


@pytest.fixture(scope="module")
def ranged_moto() -> Iterator[Any]:
    import botocore.session

    proc, endpoint = spawn()
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    try:
        client.create_bucket(Bucket="ranged")
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_ranges_read_the_right_bytes(ranged_moto: Any) -> None:
    c = ranged_moto
    data = os.urandom(7 << 20)  # above moto's 5 MiB in-memory limit
    c.put_object(Bucket="ranged", Key="big", Body=data)

    def get(rng: str | None) -> bytes:
        args = {"Range": rng} if rng else {}
        return bytes(c.get_object(Bucket="ranged", Key="big", **args)["Body"].read())

    assert get("bytes=0-0") == data[:1]
    assert get("bytes=1000-1099999") == data[1000:1100000]
    assert get(f"bytes={len(data) - 10}-") == data[-10:]
    assert get(f"bytes={len(data) - 10}-{len(data) + 100}") == data[-10:]
    assert get("bytes=-5") == data[-5:]  # suffix ranges: moto's own code
    assert get(None) == data
    head = c.get_object(Bucket="ranged", Key="big", Range="bytes=10-19")
    assert head["ContentRange"] == f"bytes 10-19/{len(data)}"
    assert head["ContentLength"] == 10
    with pytest.raises(Exception, match="InvalidRange"):
        get(f"bytes={len(data) + 1}-")
