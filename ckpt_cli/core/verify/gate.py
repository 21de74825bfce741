"""The check every writer runs on its source before writing anything: a damaged source is
refused (one line naming the first problem, pointing at ``ckpt verify``), never copied into a
valid-looking output. The structure level only (metadata, arrays, chunks, OCDBT, files): no
chunk is decoded, so it costs what ``ckpt verify`` without ``--deep`` costs."""

from __future__ import annotations

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import step_handler
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.verify.structure import check_item
from ckpt_cli.errors import RefusedError

#: Warnings that still refuse a write: a writer never copies a link or what it points to.
_REFUSED_WARNINGS = frozenset({"symlink-outside"})


def require_sound_source(ref: ItemRef) -> None:
    """Raise ``RefusedError`` when the source item has a structure error (or a symlink)."""
    boundary = ref.root or ref.step_location or ref.location
    is_step = ref.location == ref.step_location
    handler = None
    if ref.step_location is not None and not is_step:
        handlers = read_step_metadata(ref.step_location).item_handlers
        handler = step_handler(handlers, ref.name) if isinstance(handlers, dict) else None
    facts = check_item(ref.location, ".", boundary, is_step, handler)
    bad = [p for p in facts.problems if p.severity == "error" or p.code in _REFUSED_WARNINGS]
    if not bad:
        return
    first = bad[0]
    where = first.leaf or first.file or str(ref.location)
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    what = "links outside the checkpoint" if first.code == "symlink-outside" else "is damaged"
    raise RefusedError(
        f"the source {ref.location} {what}, nothing written: {first.code} at {where}{more}",
        hint=f"run `ckpt verify {ref.location}` for every problem; restore the source from a copy",
    )
