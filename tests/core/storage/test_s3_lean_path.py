"""The lean S3 path on real servers (moto and SeaweedFS): listing pages and small reads made
with ckpt's own presigned URLs, parser and event loop answer exactly what botocore's client
answers for the same requests."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_cli.core.storage import StorageOptions
from ckpt_cli.core.storage.s3 import S3Store
from ckpt_cli.core.storage.stores import open_store
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3

NAMES = [
    "a",
    "a b",
    "a+b",
    "a%41",
    "\u00e9t\u00e9",
    "\u4e2d",
    "x~y",
    "6",
    "6.orbax-checkpoint-tmp-1",
    "z!",
]


def _store(s3: S3, **kw: Any) -> S3Store:
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint, **kw))
    assert isinstance(store, S3Store)
    return store


def _pages(store: S3Store, prefix: str, **kw: Any) -> list[Any]:
    out = []
    token = None
    while True:
        page = store.list_page(prefix, token, **kw)
        out.append(page)
        token = page.token
        if token is None:
            return out


def test_listing_pages_are_botocores(
    s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = [f"{s3_prefix}/{n}/{f}" for n in NAMES for f in ("_METADATA", "d/x y")]
    keys += [f"{s3_prefix}/{n}" for n in NAMES]
    s3.server.put_objects((k, k.encode()) for k in keys)
    store = _store(s3)
    asks: list[dict[str, Any]] = [
        {},
        {"delimiter": "/"},
        {"limit": 7},
        {"limit": 5, "delimiter": "/"},
        {"start": f"{s3_prefix}/a+b\U0010ffff", "limit": 9},
    ]
    served: list[bool] = []
    real = S3Store._lean_list

    def lean_only(self: S3Store, args: dict[str, Any]) -> Any:
        page = real(self, args)
        served.append(page is not None)
        return page

    monkeypatch.setattr(S3Store, "_lean_list", lean_only)
    lean = [_pages(store, f"{s3_prefix}/", **a) for a in asks]
    # Every page went out on the lean path: none fell back to botocore.
    assert len(served) == sum(len(p) for p in lean) and all(served), served
    monkeypatch.setattr(S3Store, "_lean_list", lambda self, args: None)
    plain = [_pages(store, f"{s3_prefix}/", **a) for a in asks]
    assert lean and all(lean)
    for ours, theirs in zip(lean, plain, strict=True):
        # Tokens are the server's own and may differ between two listings; the rest may not.
        assert [(p.objects, p.prefixes) for p in ours] == [(p.objects, p.prefixes) for p in theirs]
        assert [p.token is None for p in ours] == [p.token is None for p in theirs]
    everything = [o.key for p in lean[0] for o in p.objects]
    assert sorted(everything) == sorted(keys)  # SeaweedFS lists in its directory tree's order


def test_many_small_reads_on_one_event_loop(
    s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = {
        f"{s3_prefix}/{i % 10}/{NAMES[i % len(NAMES)]}-{i}": bytes([i % 251]) * (i * 37 % 5000 + 1)
        for i in range(300)
    }
    s3.server.put_objects(blobs.items())
    store = _store(s3, max_requests=8)
    assert store.options.metadata_requests == 32
    reads: list[tuple[str, int | None, int | None]] = []
    want: list[bytes | None] = []
    for n, (key, data) in enumerate(blobs.items()):
        if n % 3 == 0:
            start, end = n % len(data), len(data)
            reads.append((key, start, end))
            want.append(data[start:end])
        else:
            reads.append((key, None, len(data)))
            want.append(data)
    reads.append((f"{s3_prefix}/missing", None, None))
    want.append(None)

    def one_by_one(self: S3Store, *args: Any) -> bytes | None:
        raise AssertionError("a read left the event loop")

    monkeypatch.setattr(S3Store, "read_object", one_by_one)
    got = store.read_objects(reads)
    assert len(got) == len(want) == 301
    assert got == want
