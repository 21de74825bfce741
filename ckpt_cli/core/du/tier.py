"""``du`` of an item of one host's local tier of Orbax's emergency checkpointing
(``format/emergency``): a leaf there stores only the chunks of that host's shards, so its
logical bytes are those of the chunks stored, not of the whole array, and the item's note says
how many chunks the tier holds.

Only an item named ``state`` (the one array item every emergency manager writes) of a step
whose names say local tier is looked at; the item's own walk gives its keys and headers, and
``_sharding`` is read only when a leaf lacks chunks.
"""

from __future__ import annotations

from dataclasses import replace

from ckpt_cli.core.du.types import LeafUsage
from ckpt_cli.core.format.arrays import ArrayInfo, parse_zarr_header
from ckpt_cli.core.format.emergency import STATE_ITEM, LeafChunks, assess_local_tier
from ckpt_cli.core.format.names import parse_chunk_part, split_key, storage_dir
from ckpt_cli.core.format.ocdbt import Value
from ckpt_cli.core.format.sharding import read_shardings
from ckpt_cli.core.format.tiers import tier_of_step_dir
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError

#: (item-relative file, offset, length): an out-of-line value (``du/ocdbt.Range``).
_Range = tuple[str, int, int]
_HEADERS = ("zarr.json", ".zarray")


def _stored_chunks(
    item: Location, values: dict[bytes, Value | _Range]
) -> dict[str, tuple[ArrayInfo, frozenset[tuple[int, ...]]]]:
    """Each leaf's header and the chunk indices its keys store (headers out of line read)."""
    zarr3 = any(k.endswith(b"zarr.json") for k in values)
    parts: dict[str, list[str]] = {}
    headers: dict[str, Value | _Range] = {}
    for key, v in values.items():
        name, part = split_key(key, zarr3)
        if part in _HEADERS:
            headers[name] = v
        else:
            parts.setdefault(name, []).append(part)
    out_of_line = [(n, v) for n, v in headers.items() if not isinstance(v, bytes)]
    fetched = item.read_ranges([(item.child(v[0]), v[1], v[1] + v[2]) for _, v in out_of_line])
    raw = {n: v for n, v in headers.items() if isinstance(v, bytes)}
    raw.update((n, data) for (n, _), data in zip(out_of_line, fetched, strict=True))
    out = {}
    for name, data in raw.items():
        info = parse_zarr_header(name, data, str(item))
        present = {
            i
            for p in parts.get(name, [])
            if (i := parse_chunk_part(p, zarr3, len(info.shape))) is not None
        }
        out[name] = (info, frozenset(present))
    return out


def _stored_bytes(info: ArrayInfo, present: frozenset[tuple[int, ...]]) -> int:
    return sum(info.chunk_nbytes(i) for i in present)


def local_tier_leaves(
    item: Location,
    values: dict[bytes, Value | _Range],
    leaves: tuple[LeafUsage, ...],
    note: str | None,
) -> tuple[tuple[LeafUsage, ...], str | None]:
    """``leaves`` and the item's ``note``, as a local tier's: the logical bytes of a leaf
    partial by design are its stored chunks', and the note says how many chunks are here.
    Unchanged for any other item (or where the headers cannot be read: ``verify`` says why)."""
    if item.name != STATE_ITEM or (tier := tier_of_step_dir(item.parent)) is None:
        return leaves, note
    try:
        stored = _stored_chunks(item, values)
        if all(len(p) >= info.num_chunks for info, p in stored.values()):
            return leaves, note
        shardings = {storage_dir(n): s for n, s in read_shardings(item).items()}
    except CkptError:
        return leaves, note
    chunks = [
        LeafChunks(n, info.shape, info.chunk_shape, shardings.get(n), present)
        for n, (info, present) in stored.items()
    ]
    if assess_local_tier(tier, chunks) is None:
        return leaves, note
    partial = {n: (info, p) for n, (info, p) in stored.items() if len(p) < info.num_chunks}
    out = tuple(
        replace(leaf, logical_bytes=_stored_bytes(*partial[leaf.name]), partial=True)
        if leaf.name in partial
        else leaf
        for leaf in leaves
    )
    held = sum(len(p) for _, p in stored.values())
    total = sum(info.num_chunks for info, _ in stored.values())
    mine = (
        f"{tier.short()}: holds {held} of {total} chunks ({len(partial)} leaves partial by "
        "design; their logical bytes are those of the chunks stored here)"
    )
    return out, mine if note is None else f"{note}; {mine}"
