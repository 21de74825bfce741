"""The recorded ``ld1`` digests a writer carries: those of output leaves that read one source
leaf unchanged (``reshard`` carries every leaf; ``migrate`` and ``export`` the unchanged ones).
The writer checks each against the blocks it writes (``digests.BlockDigests``)."""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_cli.core.format.digests import LeafDigest, read_digests
from ckpt_cli.core.migrate import ops
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError


def carried(
    recorded: Mapping[str, LeafDigest] | None, exprs: Mapping[str, ops.Node | None]
) -> dict[str, str]:
    """Output name -> the recorded ``ld1`` of its source leaf, for outputs that read one leaf
    unchanged (same dtype and shape as recorded)."""
    out: dict[str, str] = {}
    for name, expr in exprs.items():
        if not isinstance(expr, ops.Source) or recorded is None:
            continue
        rec = recorded.get(expr.name)
        if rec is not None and rec.ld1 and (rec.dtype, rec.shape) == (expr.dtype, expr.shape):
            out[name] = rec.ld1
    return out


def recorded_leaves(item: Location) -> dict[str, LeafDigest] | None:
    """An item's recorded digests (None: no record, or a damaged one: ``verify``'s business)."""
    try:
        record = read_digests(item)
    except CkptError:
        return None
    return record.leaves if record is not None else None
