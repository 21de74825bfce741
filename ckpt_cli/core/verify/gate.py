"""The check every writer runs on its source before writing anything: a damaged source is
refused (one line naming the first problem, pointing at ``ckpt verify``), never copied into a
valid-looking output. The structure level only (metadata, arrays, chunks, OCDBT, files): no
chunk is decoded, so it costs what ``ckpt verify`` without ``--deep`` costs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import step_handler
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.scan import Locate
from ckpt_cli.core.format.tiers import partial_leaf_message, tier_of_step_dir
from ckpt_cli.core.verify.structure import check_item
from ckpt_cli.core.verify.types import ItemFacts
from ckpt_cli.errors import CkptError, RefusedError

if TYPE_CHECKING:
    from ckpt_cli.core.digest.filesums import ReadTaps

#: Warnings that still refuse a write: a writer never copies a link or what it points to.
_REFUSED_WARNINGS = frozenset({"symlink-outside"})


def _structure(ref: ItemRef) -> ItemFacts:
    """The structure pass of one item (what ``ckpt verify`` without ``--deep`` checks)."""
    boundary = ref.root or ref.step_location or ref.location
    is_step = ref.location == ref.step_location
    handler = None
    tier = None
    if ref.step_location is not None and not is_step:
        handlers = read_step_metadata(ref.step_location).item_handlers
        handler = step_handler(handlers, ref.name) if isinstance(handlers, dict) else None
        # One host's local tier of Orbax's emergency checkpointing: other hosts' chunks are
        # missing by design, not damage (``require_sound_source`` says so instead).
        tier = tier_of_step_dir(ref.step_location)
    return check_item(ref.location, ".", boundary, is_step, handler, tier)


def item_locator(ref: ItemRef) -> Locate | None:
    """``chunk_locator`` for a reader that refuses nothing (``digest``, ``du --deep``): the
    places of a local OCDBT item's chunks when its structure pass found no error; else None
    (its chunks are read through TensorStore, and what is wrong is reported as it is met)."""
    from ckpt_cli.core.storage.local import LocalLocation

    if not isinstance(ref.location, LocalLocation):
        return None
    try:
        facts = _structure(ref)
    except CkptError:
        return None  # the readers meet it and say so, as they did before
    if any(p.severity == "error" for p in facts.problems):
        return None
    return chunk_locator(facts)


def require_sound_source(ref: ItemRef) -> ItemFacts:
    """Raise ``RefusedError`` when the source item has a structure error (or a symlink); else
    the structure pass's facts (``chunk_locator`` finds the chunks in them)."""
    facts = _structure(ref)
    bad = [p for p in facts.problems if p.severity == "error" or p.code in _REFUSED_WARNINGS]
    if not bad and facts.tier is not None and facts.partial:
        # Whole leaves are what a writer writes: a leaf held here only in part is refused
        # as what it is, never called damage.
        leaf = sorted(facts.partial)[0]
        raise RefusedError(
            f"{partial_leaf_message(leaf, facts.tier)}: nothing written",
            hint="a writer reads whole leaves; give it the persistent tier's step",
        )
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


def chunk_locator(facts: ItemFacts, taps: ReadTaps | None = None) -> Locate | None:
    """Where a chunk's stored bytes lie in a local data file, from the structure pass's OCDBT
    references (``ItemFacts.keys``): chunks streamed here are then read from the file itself
    (``chunkread.FileValue``), not through the OCDBT kvstore. None off a local disk or OCDBT.
    ``taps``: told of every range read, by file (``verify --deep``'s file CRC-32s)."""
    from ckpt_cli.core.format.chunkread import Place
    from ckpt_cli.core.storage.local import LocalLocation

    if not local_ocdbt(facts):
        return None
    base = facts.inventory.base if facts.inventory else None
    assert isinstance(base, LocalLocation)

    def locate(leaf: str, key: str) -> Place | None:
        ref = facts.keys.get(f"{leaf}/{key}".encode())
        if ref is None:
            return None
        path = os.path.join(base.path, *ref.file.split("/"))
        return Place(path, ref.offset, ref.length, taps.tap(ref.file) if taps else None)

    return locate


def local_ocdbt(facts: ItemFacts) -> bool:
    """Whether the item's chunks can be read from its data files at known places: an OCDBT
    item on a local disk whose structure was checked."""
    from ckpt_cli.core.storage.local import LocalLocation

    base = facts.inventory.base if facts.inventory else None
    return (
        isinstance(base, LocalLocation)
        and facts.store is not None
        and facts.store.layout == "ocdbt"
    )
