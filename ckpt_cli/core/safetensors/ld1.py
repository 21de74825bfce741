"""``ld1`` digests through ``export`` and ``import``: the ``ckpt.ld1`` metadata key.

``export`` writes the ``ld1`` of every tensor into every file's ``__metadata__`` as ``ckpt.ld1``
= compact JSON ``{tensor: digest}``, computed from the blocks it writes (no second read), with
or without a record in the source. The header is planned with a placeholder of the digest's
fixed length (``PENDING``, what ``--dry-run`` shows) and rewritten in place once every tensor
is written, before the output is renamed into place. The source's recorded ``ld1`` (a
version-2 ``_CKPT_DIGESTS.json``) of every tensor whose values it writes unchanged (a plain
read of one leaf: no cast, transpose, slice) is checked against the blocks' digest
(``digests.BlockDigests``): a difference aborts the export before the rename. ``import`` checks the digests the same way as
it writes the step (``Pipeline``'s ``expect``) and records them in the new item, so ``verify
--deep`` checks them later. ``ld1`` does not depend on the layout: the digest of a tensor in a
safetensors file equals the digest of the Orbax leaf it came from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from ckpt_cli.errors import InvalidMetadataError, StorageError

LD1_KEY = "ckpt.ld1"
#: The placeholder of a digest computed while exporting: the length of ``ld1:`` + 32 hex.
PENDING = "ld1:" + "-" * 32


def encode(digests: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(digests.items())), separators=(",", ":"))


def decode(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The ``ckpt.ld1`` map of a file's metadata ({} when absent); damage raises."""
    raw = (metadata or {}).get(LD1_KEY)
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.startswith("ld1:") for k, v in doc.items()
    ):
        raise InvalidMetadataError(
            f"the safetensors metadata key {LD1_KEY!r} is not a JSON map of tensor names to "
            "ld1 digests",
            hint=f"remove the {LD1_KEY} key, or export the file again with ckpt",
        )
    return doc


def planned(names: Iterable[str], carried: Mapping[str, str]) -> str:
    """The planned ``ckpt.ld1``: the carried digests, ``PENDING`` for the others."""
    return encode({name: carried.get(name, PENDING) for name in names})


def expected(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """The carried digests a planned ``ckpt.ld1`` holds (those to check while exporting)."""
    return {k: v for k, v in decode(metadata).items() if v != PENDING}


def fill_headers(directory: str, files: Any, metadata: Mapping[str, str]) -> None:
    """Rewrite the header of every planned file in ``directory`` with ``metadata`` (the same
    length: only placeholders changed), then flush it to disk."""
    from ckpt_cli.core.safetensors.header import encode_header

    for shard in files.files:
        encoded = encode_header(shard.header.tensors, metadata)
        if len(encoded) != len(shard.encoded_header):
            raise ValueError(f"{shard.name}: the filled header changed length")
        path = os.path.join(directory, shard.name)
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, encoded, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError.from_error(f"cannot write the header of {path}", e) from None
