"""The check every writer runs on its source before writing anything: a damaged source is
refused (one line naming the first problem, pointing at ``ckpt verify``), never copied into a
valid-looking output. The structure level only (metadata, arrays, chunks, OCDBT, files): no
chunk is decoded, so it costs what ``ckpt verify`` without ``--deep`` costs."""

from __future__ import annotations

import os

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import step_handler
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.scan import Locate
from ckpt_cli.core.verify.structure import check_item
from ckpt_cli.core.verify.types import ItemFacts
from ckpt_cli.errors import RefusedError

#: Warnings that still refuse a write: a writer never copies a link or what it points to.
_REFUSED_WARNINGS = frozenset({"symlink-outside"})


def require_sound_source(ref: ItemRef) -> ItemFacts:
    """Raise ``RefusedError`` when the source item has a structure error (or a symlink); else
    the structure pass's facts (``chunk_locator`` finds the chunks in them)."""
    boundary = ref.root or ref.step_location or ref.location
    is_step = ref.location == ref.step_location
    handler = None
    if ref.step_location is not None and not is_step:
        handlers = read_step_metadata(ref.step_location).item_handlers
        handler = step_handler(handlers, ref.name) if isinstance(handlers, dict) else None
    facts = check_item(ref.location, ".", boundary, is_step, handler)
    bad = [p for p in facts.problems if p.severity == "error" or p.code in _REFUSED_WARNINGS]
    if not bad:
        return facts
    first = bad[0]
    where = first.leaf or first.file or str(ref.location)
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    what = "links outside the checkpoint" if first.code == "symlink-outside" else "is damaged"
    raise RefusedError(
        f"the source {ref.location} {what}, nothing written: {first.code} at {where}{more}",
        hint=f"run `ckpt verify {ref.location}` for every problem; restore the source from a copy",
    )


def chunk_locator(facts: ItemFacts) -> Locate | None:
    """Where a chunk's stored bytes lie in a local data file, from the structure pass's OCDBT
    references (``ItemFacts.keys``): chunks streamed here are then read from the file itself
    (``chunkread.FileValue``), not through the OCDBT kvstore. None off a local disk or OCDBT."""
    from ckpt_cli.core.storage.local import LocalLocation

    base = facts.inventory.base if facts.inventory else None
    if not isinstance(base, LocalLocation) or facts.store is None or facts.store.layout != "ocdbt":
        return None

    def locate(leaf: str, key: str) -> tuple[str, int, int] | None:
        ref = facts.keys.get(f"{leaf}/{key}".encode())
        if ref is None:
            return None
        return os.path.join(base.path, *ref.file.split("/")), ref.offset, ref.length

    return locate
