"""``tests/support/remote_servers.py``: SeaweedFS's ``put_objects`` stores every object it is
given, a key beside its own directory (``r/231`` and ``r/231/a``) too. SeaweedFS keeps such a key
as the content of the directory entry and loses one of the two when their PUTs arrive together,
answering both 200: the listing tests saw ``r/231`` missing from every listing (``HEAD`` 404)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from tests.support.remote_servers import BUCKET, directories_last, keys
from tests.support.storage_fixtures import S3

#: Keys beside their directories at two depths, and keys that name no directory.
NAMES = ("231", "231/a", "231/b/c", "6", "6/a", "6.txt", "n", "n/m", "n/m/x", "zz")


def test_directories_go_last_and_nothing_else_does() -> None:
    waves = [[k for k, _ in wave] for wave in directories_last([(n, b"") for n in NAMES])]
    assert waves == [
        ["231/a", "231/b/c", "6/a", "6.txt", "n/m/x", "zz"],
        ["n/m"],
        ["231", "6", "n"],
    ]
    assert directories_last([]) == []


def test_a_key_beside_its_directory_is_put_after_the_keys_below_it(
    seaweed_s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each PUT of a key below a directory key is held until that key's PUT is sent (or
    0.3 s): sent in one wave, the two would be in flight together, which is what loses one."""
    prefix = f"t/{uuid.uuid4().hex[:12]}"
    want = sorted(f"{prefix}/{n}" for n in NAMES)
    directories = [k for k in want if any(o.startswith(k + "/") for o in want)]
    assert len(directories) == 4
    sent = {k: threading.Event() for k in want}
    order: list[tuple[str, str]] = []
    lock = threading.Lock()
    server = seaweed_s3.server
    plain_client = server.client

    def start(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        key = context["put_key"] = params["Key"]
        with lock:
            order.append(("sent", key))
        sent[key].set()
        for d in directories:
            if key.startswith(d + "/"):
                sent[d].wait(0.3)

    def end(context: dict[str, Any], **_: Any) -> None:
        with lock:
            order.append(("answered", context["put_key"]))

    def client(pool: int = 10) -> Any:
        c = plain_client(pool)
        c.meta.events.register("provide-client-params.s3.PutObject", start)
        c.meta.events.register("after-call.s3.PutObject", end)
        return c

    monkeypatch.setattr(server, "client", client)
    assert server.put_objects((k, k.encode()) for k in want) == len(want)
    assert sorted(k for what, k in order if what == "answered") == want
    for d in directories:
        below = [k for k in want if k.startswith(d + "/")]
        assert below
        late = [k for k in below if order.index(("answered", k)) > order.index(("sent", d))]
        assert not late, f"{d} was sent before {late} were stored"
    assert sorted(keys(seaweed_s3.client, prefix + "/")) == want
    for k in want:
        assert seaweed_s3.client.get_object(Bucket=BUCKET, Key=k)["Body"].read() == k.encode()
