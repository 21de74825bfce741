"""The recorded ``ld1`` digests a writer carries: those of output leaves that read one source
leaf unchanged (``reshard`` carries every leaf; ``migrate`` and ``export`` the unchanged ones).
The writer checks each against the blocks it writes (``digests.BlockDigests``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ckpt_cli.core.digest.records import LeafDigest, read_digests
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError


class SourceRead(Protocol):
    """A plain read of one source leaf (``spec.ops.Source``, from ``ops.source_reads``)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


def carried(
    recorded: Mapping[str, LeafDigest] | None, reads: Mapping[str, SourceRead]
) -> dict[str, str]:
    """Output name -> the recorded ``ld1`` of its source leaf, for outputs that read one leaf
    unchanged (``reads``; same dtype and shape as recorded)."""
    out: dict[str, str] = {}
    for name, expr in reads.items():
        if recorded is None:
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
