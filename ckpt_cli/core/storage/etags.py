"""What a bucket's listing says about an object's bytes (its *content tag*), and whether a
file's bytes are the ones a tag describes, worked out from the file alone.

S3 lists an ETag with every key: for an object put in one request it is the MD5 of its bytes;
for a multipart upload, the MD5 of the parts' binary MD5s followed by ``-`` and the number of
parts. (With SSE-KMS or SSE-C it is neither; such a tag simply never matches.) GCS lists
``md5Hash`` (base64) for every object but composed ones. A tag that matches proves the bytes
equal without reading the object back; one that does not proves nothing (another part size,
another encryption): the caller then compares the bytes the slow way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib


def s3_tag(etag: object) -> str | None:
    """``s3:<etag>`` from a listing's ``ETag`` (quotes dropped, hex lower-cased)."""
    if not isinstance(etag, str):
        return None
    value = etag.strip().strip('"').lower()
    return f"s3:{value}" if value else None


def gcs_tag(md5_hash: object) -> str | None:
    """``md5:<hex>`` from a GCS listing's base64 ``md5Hash`` (absent for composed objects)."""
    if not isinstance(md5_hash, str) or not md5_hash:
        return None
    try:
        raw = base64.b64decode(md5_hash, validate=True)
    except (binascii.Error, ValueError):
        return None
    return f"md5:{raw.hex()}" if len(raw) == 16 else None


class TagHasher:
    """The MD5 of a file's bytes and of each ``part_bytes`` part, fed the bytes in order."""

    def __init__(self, part_bytes: int) -> None:
        self.part_bytes = part_bytes
        self._whole = hashlib.md5(usedforsecurity=False)
        self._part = hashlib.md5(usedforsecurity=False)
        self._in_part = 0
        self._parts: list[bytes] = []

    def update(self, piece: bytes | memoryview) -> None:
        self._whole.update(piece)
        view = memoryview(piece)
        while view:
            take = min(len(view), self.part_bytes - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self.part_bytes:
                self._parts.append(self._part.digest())
                self._part = hashlib.md5(usedforsecurity=False)
                self._in_part = 0

    def matches(self, tag: str) -> bool:
        """Whether ``tag`` describes the bytes fed so far (False for a tag of unknown form)."""
        kind, _, value = tag.partition(":")
        whole = self._whole.hexdigest()
        if kind == "md5":
            return value == whole
        if kind != "s3":
            return False
        if "-" not in value:
            return value == whole
        digest, _, count = value.partition("-")
        parts = self._parts + ([self._part.digest()] if self._in_part else [])
        if not count.isdigit() or int(count) != len(parts):
            return False  # uploaded in parts of another size: no verdict
        return hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest() == digest
