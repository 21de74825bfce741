"""``ld1`` digests through ``export`` and ``import``: the ``ckpt.ld1`` metadata key.

``export`` carries the source's recorded ``ld1`` (a version-2 ``_CKPT_DIGESTS.json``) of every
tensor whose values it writes unchanged (a plain read of one leaf: no cast, transpose, slice)
into every file's ``__metadata__`` as ``ckpt.ld1`` = compact JSON ``{tensor: digest}``, and
checks each of them against the blocks it writes (``digests.BlockDigests``): a difference aborts the
export before the output is renamed into place. ``import`` checks the digests the same way as
it writes the step (``Pipeline``'s ``expect``) and records them in the new item, so ``verify
--deep`` checks them later. ``ld1`` does not depend on the layout: the digest of a tensor in a
safetensors file equals the digest of the Orbax leaf it came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ckpt_cli.errors import InvalidMetadataError

LD1_KEY = "ckpt.ld1"


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
