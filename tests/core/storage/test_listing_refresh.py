"""``refresh`` on a bucket location forgets its own prefix only, on real servers (moto and
SeaweedFS). The locations below one root share one listing: two steps of one ``cp`` check their
files at once, each after a refresh of its own; a refresh that cleared the whole listing let one
step's check read the listing while the other's had just emptied it, and fail a complete step
("... is gone just before step 600 was committed")."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_cli.core.storage import open_location
from ckpt_cli.core.storage.prefixes import Listing
from ckpt_cli.core.storage.remote import RemoteLocation
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3

FILES = ["_CHECKPOINT_METADATA", "default/_METADATA", "default/_sharding", "default/d/abc"]


def _root(s3: S3, prefix: str) -> RemoteLocation:
    keys = [f"{prefix}/{step}/{f}" for step in ("500", "600") for f in FILES]
    s3.server.put_objects((k, k.encode()) for k in keys)
    root = open_location(f"s3://{BUCKET}/{prefix}")
    assert isinstance(root, RemoteLocation)
    return root


def _walk(loc: RemoteLocation) -> set[str]:
    return {rel for rel, _ in loc.walk()}


def test_a_refresh_landing_inside_another_locations_walk_leaves_it_whole(
    s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(s3, s3_prefix)
    a, b = root.child("600"), root.child("500")
    real = Listing.ensure
    landed: list[str] = []

    def ensure_then_other_refresh(self: Listing, prefix: str) -> None:
        real(self, prefix)
        if prefix == a._dir and not landed:  # the other step's refresh, right after a's listing
            landed.append(prefix)
            b.refresh()

    monkeypatch.setattr(Listing, "ensure", ensure_then_other_refresh)
    assert _walk(a) == set(FILES)
    assert landed == [a._dir]
    assert _walk(b) == set(FILES)


def test_a_refresh_keeps_what_other_prefixes_know(s3: S3, s3_prefix: str) -> None:
    root = _root(s3, s3_prefix)
    a, b = root.child("600"), root.child("500")
    assert _walk(a) == set(FILES)
    asked = root.store.requests
    b.refresh()
    assert _walk(a) == set(FILES)
    assert root.store.requests == asked, "a's listing was forgotten by b's refresh"
    assert _walk(b) == set(FILES)
    assert root.store.requests > asked, "b's refresh did not make it list again"


@pytest.mark.parametrize("listed_first", ["root", "step"])
def test_a_refresh_sees_what_another_process_deleted(
    s3: S3, s3_prefix: str, listed_first: str
) -> None:
    root = _root(s3, s3_prefix)
    a = root.child("600")
    first: Any = root if listed_first == "root" else a
    assert _walk(first)  # listed (the root: covering a's prefix too)
    gone = f"{s3_prefix}/600/default/_sharding"
    s3.server.client().delete_object(Bucket=BUCKET, Key=gone)
    assert "default/_sharding" in _walk(a), "answered from the listing made before"
    a.refresh()
    assert _walk(a) == set(FILES) - {"default/_sharding"}
    # A wider listing made again drops the key too (it was known from the first listing).
    root.refresh()
    assert "600/default/_sharding" not in _walk(root)
    assert {f"500/{f}" for f in FILES} <= _walk(root)
    assert not a.child("default", "_sharding").is_file()
    assert a.child("default", "_METADATA").is_file()


def test_a_refresh_of_a_file_lists_it_again(s3: S3, s3_prefix: str) -> None:
    root = _root(s3, s3_prefix)
    f = root.child("600", "default", "_sharding")
    assert _walk(root)
    assert f.is_file()
    s3.server.client().delete_object(Bucket=BUCKET, Key=f.key)
    f.refresh()
    assert not f.is_file()
    assert root.child("600", "default", "_METADATA").is_file()
