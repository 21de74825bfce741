"""Read what ``emergency.py`` judges: whether a step on storage is one host's local tier of
Orbax's emergency checkpointing, and which leaves of its items hold only that host's shards.

``step_local_tier`` costs nothing for a step whose names rule it out (neither a
``process_metadata`` nor a ``state`` item): one listing of each item directory and, where it
exists, the two small JSON files of ``process_metadata``. ``item_local_tier`` reads more (the
item's zarr headers, ``_sharding`` and one listing of its OCDBT keys): readers call it only
after a read failed (``partial_leaf_refusal``), or for a step already taken for a local tier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckpt_cli.core.format.arrays import ItemStore, parse_zarr_header
from ckpt_cli.core.format.emergency import (
    GLOBAL_PROCESS_METADATA,
    MESH_METADATA,
    PROCESS_METADATA_ITEM,
    STATE_ITEM,
    LeafChunks,
    LocalTier,
    ProcessMetadata,
    TierVerdict,
    assess_local_tier,
    is_process_metadata_handler,
    local_tier_of_step,
    parse_process_metadata,
)
from ckpt_cli.core.format.metadata import peek_storage_flags, read_step_metadata
from ckpt_cli.core.format.names import (
    MANIFEST,
    TMP_MARKER,
    parse_chunk_part,
    split_key,
    storage_dir,
)
from ckpt_cli.core.format.sharding import read_shardings
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import CkptError, RefusedError


def read_process_metadata(item: Location) -> ProcessMetadata | None:
    """The ``process_metadata`` item's device ids per process; None when unreadable."""
    try:
        return parse_process_metadata(
            item.child(GLOBAL_PROCESS_METADATA).read_json(), item.child(MESH_METADATA).read_json()
        )
    except CkptError:
        return None


def step_local_tier(
    step: Location,
    entries: Sequence[Entry],
    handlers: Mapping[str, str] | str | None = None,
) -> LocalTier | None:
    """Whether the step (``entries``: its listing; ``handlers``: its recorded item handlers)
    is a local-tier copy: ``emergency.local_tier_of_step`` on its items' top-level names. A
    ``single-writer`` answer is a candidate the chunks must confirm (``item_local_tier``)."""
    handlers = handlers if isinstance(handlers, Mapping) else {}
    # Never through a link: it may lead out of the checkpoint (verify reports it).
    dirs = [e.name for e in entries if e.is_dir and not e.is_symlink and TMP_MARKER not in e.name]
    if not (
        PROCESS_METADATA_ITEM in dirs
        or STATE_ITEM in dirs
        or any(is_process_metadata_handler(h) for h in handlers.values())
    ):
        return None
    items: dict[str, list[str]] = {}
    for name in dirs:
        try:
            items[name] = [e.name for e in step.child(name).list()]
        except CkptError:
            items[name] = []
    metadata = None
    if PROCESS_METADATA_ITEM in items:
        metadata = read_process_metadata(step.child(PROCESS_METADATA_ITEM))
    return local_tier_of_step(items, handlers, metadata)


def tier_of_step_dir(step: Location) -> LocalTier | None:
    """``step_local_tier`` of a step directory listed and read here; None when unreadable."""
    try:
        entries = step.list()
    except CkptError:
        return None
    try:
        handlers = read_step_metadata(step).item_handlers
    except CkptError:
        handlers = None
    return step_local_tier(step, entries, handlers)


def item_leaf_chunks(item: Location) -> list[LeafChunks] | None:
    """Every array of a merged OCDBT item with the chunk indices it stores (one listing of its
    keys); None for any other layout."""
    names = {e.name for e in item.list()}
    if MANIFEST not in names:
        return None
    flags = peek_storage_flags(item)
    store = ItemStore(item, bool(flags and flags[1]))
    keys = store.database_keys()
    header = store.header_name
    by_dir: dict[str, list[str]] = {}
    for key in keys:
        where, part = split_key(key, store.use_zarr3)
        by_dir.setdefault(where, []).append(part)
    arrays = sorted(d for d, parts in by_dir.items() if header in parts)
    raw, _ = store.read_header_bytes(arrays)
    shardings = {storage_dir(n): s for n, s in read_shardings(item).items()}
    out = []
    for name, (data, _) in sorted(raw.items()):
        info = parse_zarr_header(name, data, str(item))
        present = {
            i
            for part in by_dir.get(storage_dir(name), [])
            if (i := parse_chunk_part(part, store.use_zarr3, len(info.shape))) is not None
        }
        sharding = shardings.get(storage_dir(name))
        out.append(LeafChunks(name, info.shape, info.chunk_shape, sharding, frozenset(present)))
    return out


@dataclass(frozen=True)
class ItemTier:
    """An item of a local-tier step: the tier, and the verdict on its chunks (None when they
    could not be read or judged)."""

    tier: LocalTier
    verdict: TierVerdict | None
    leaves: tuple[LeafChunks, ...] = ()

    def is_partial(self, leaf: str) -> bool:
        """Whether ``leaf`` lacks chunks by design here (other hosts hold them)."""
        key = storage_dir(leaf)
        if self.verdict is not None and self.verdict.devices is not None:
            return any(storage_dir(h.name) == key for h in self.verdict.partial)
        if self.tier.marker != "process-metadata":
            return False
        # Orbax's marker says local tier, but whose the missing chunks are cannot be told.
        found = next((c for c in self.leaves if storage_dir(c.name) == key), None)
        return found is None or found.present != found.all_chunks()


def item_local_tier(item: Location, tier: LocalTier | None = None) -> ItemTier | None:
    """The local tier ``item`` belongs to (``tier``: its step's, when known), judged on its
    chunks; None when its step is no local tier, or a ``single-writer`` candidate whose chunks
    do not show one host's shards."""
    if tier is None:
        tier = tier_of_step_dir(item.parent)
    if tier is None:
        return None
    try:
        leaves = item_leaf_chunks(item)
    except CkptError:
        leaves = None
    verdict = assess_local_tier(tier, leaves) if leaves is not None else None
    if verdict is None and tier.marker == "single-writer":
        return None
    return ItemTier(tier, verdict, tuple(leaves or ()))


def partial_leaf_message(leaf: str, tier: LocalTier) -> str:
    return f"{leaf} is only partly on this host ({tier.short()}): read the persistent tier"


def partial_leaf_refusal(item: Location, leaf: str) -> RefusedError | None:
    """For a reader whose read of ``leaf`` failed: the refusal to raise instead when the item
    is a local tier's and the leaf holds only this host's shards there by design; None where
    the reader's own error stands (damage, or no local tier)."""
    try:
        found = item_local_tier(item)
    except CkptError:
        return None
    if found is None or not found.is_partial(leaf):
        return None
    return RefusedError(partial_leaf_message(leaf, found.tier))


def listed_local_tier(
    step: Location,
    entries: Sequence[Entry],
    handlers: Mapping[str, str] | str | None,
    confirm: bool,
) -> LocalTier | None:
    """What ``ls`` says of a step: a local tier Orbax's marker names; a ``single-writer``
    candidate only where ``confirm`` (a local disk) and its chunks show one host's shards,
    and only for a writer other than process 0: a one-process save is process 0's, and
    telling the two apart reads the chunk keys of every step."""
    tier = step_local_tier(step, entries, handlers)
    if tier is None or tier.marker == "process-metadata":
        return tier
    if not confirm or not tier.process:
        return None
    return tier if item_local_tier(step.child(STATE_ITEM), tier) is not None else None
