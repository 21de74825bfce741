"""Content tags (``core/storage/etags.py``) against what the real test servers list: moto's S3
ETags for a single put and for ckpt's own multipart upload, the GCS emulator's md5Hash."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import numpy as np

from tests.support.remote_servers import BUCKET, GcsServer
from tests.support.storage_fixtures import S3


def _bytes(n: int) -> bytes:
    return np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()


def tag_matches(tag: str, pieces: list[bytes], part_bytes: int) -> bool:
    """Whether the bytes of ``pieces``, fed in order, are those ``tag`` describes."""
    from ckpt_cli.core.storage.etags import TagHasher

    hasher = TagHasher(part_bytes)
    for piece in pieces:
        hasher.update(piece)
    return hasher.matches(tag)


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _listed(url: str) -> Any:
    from ckpt_cli.core.storage import open_location

    loc = open_location(url)
    assert list(loc.parent.walk())  # one listing of the directory, tags and all
    return loc


def test_s3_single_put_and_multipart_tags_match_the_bytes(s3: S3, s3_prefix: str) -> None:
    from ckpt_cli.core.storage.objstore import PART_BYTES

    small, big = _bytes(100_000), _bytes(2 * PART_BYTES + 12_345)  # big: 3 parts
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/d/small", Body=small)
    from ckpt_cli.core.storage import open_location

    open_location(f"s3://{BUCKET}/{s3_prefix}/d/big").write_stream(_pieces(big, 1 << 20), len(big))

    small_loc = _listed(f"s3://{BUCKET}/{s3_prefix}/d/small")
    big_loc = _listed(f"s3://{BUCKET}/{s3_prefix}/d/big")
    small_tag, big_tag = small_loc.content_tag(), big_loc.content_tag()
    assert small_tag == f"s3:{hashlib.md5(small).hexdigest()}"
    assert big_tag is not None and big_tag.endswith("-3")  # the server's multipart ETag
    # Fed in pieces that do not line up with the parts, the bytes give the same tags.
    assert tag_matches(small_tag, _pieces(small, 7_000), PART_BYTES)
    assert tag_matches(big_tag, _pieces(big, 3_000_001), PART_BYTES)
    # Other bytes, or parts of another size, never match.
    changed = big[:-1] + bytes([big[-1] ^ 1])
    assert not tag_matches(big_tag, _pieces(changed, 1 << 20), PART_BYTES)
    assert not tag_matches(big_tag, _pieces(big, 1 << 20), 16 << 20)
    assert not tag_matches(small_tag, [small[:-1]], PART_BYTES)


def test_gcs_listing_gives_an_md5_tag(gcs: GcsServer) -> None:
    from ckpt_cli.core.storage import open_location

    data = _bytes(50_000)
    url = f"gs://{BUCKET}/etag-{uuid.uuid4().hex[:8]}/d/obj"
    open_location(url).write_bytes(data)
    tag = _listed(url).content_tag()
    assert tag == f"md5:{hashlib.md5(data).hexdigest()}"
    assert tag_matches(tag, _pieces(data, 4096), 8 << 20)


def test_tags_of_unknown_form_never_match() -> None:
    from ckpt_cli.core.storage.etags import gcs_tag, s3_tag

    assert s3_tag('"ABC"') == "s3:abc" and s3_tag(None) is None and s3_tag('""') is None
    assert gcs_tag("not base64!") is None and gcs_tag("") is None
    assert gcs_tag("AAAA") is None  # decodes, but not to 16 bytes
    assert not tag_matches("crc32c:1234", [b"x"], 8)
    assert not tag_matches("s3:abc-x", [b"x"], 8)
