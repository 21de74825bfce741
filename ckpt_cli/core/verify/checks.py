"""Array-level structure checks: leaves against arrays, headers against the other metadata,
stored chunk keys against each array's chunk grid, and the item against its recorded digests.

``_METADATA`` carries no dtype or global shape, so a header's shape is checked against what
does: ``write_shape`` (from ``_METADATA`` or ``array_metadatas``) under the ``_sharding`` mesh
and partition spec. A write shape equals the shard shape, or divides it on a replicated array
(replica-parallel saves split a shard across replicas). dtype is recorded nowhere by Orbax: only
a recorded digest file can tell that a header's dtype was changed.
"""

from __future__ import annotations

import math

from ckpt_cli.core.digest.records import DIGEST_FILE, recorded_file, same_values, string_digest
from ckpt_cli.core.format.arrays import ArrayInfo, parse_zarr_header
from ckpt_cli.core.format.metadata import ArrayMetadata, LeafMeta, TreeMetadata
from ckpt_cli.core.format.names import parse_chunk_part, split_key, storage_dir
from ckpt_cli.core.format.sharding import ShardingInfo
from ckpt_cli.core.format.sizes import size_problem
from ckpt_cli.core.storage.base import loads_json
from ckpt_cli.core.verify.tier import Stored, settle_chunks
from ckpt_cli.core.verify.types import ItemFacts
from ckpt_cli.errors import CkptError, InvalidMetadataError, first_line

_RESTORE = "restore it from a copy of this step"


def check_arrays(
    facts: ItemFacts,
    tree: TreeMetadata,
    shardings: dict[str, ShardingInfo],
    array_metas: dict[str, ArrayMetadata],
    broken: set[str],
) -> None:
    store = facts.store
    assert store is not None
    headers, parts_of = _stored_arrays(facts, tree, store.header_name)
    facts.arrays_seen = {storage_dir(n) for n in headers}
    _check_leaves_have_arrays(facts, tree, headers, parts_of)
    metas = {m.name: m for m in tree.leaves}
    names = sorted(headers & {m.name for m in tree.leaves if m.has_array})
    if not _check_headers(facts, names, metas, shardings, array_metas, broken, parts_of):
        return
    if facts.record is not None:
        _check_record_leaves(facts, tree)


def _stored_arrays(
    facts: ItemFacts, tree: TreeMetadata, header: str
) -> tuple[set[str], dict[str, list[str]]]:
    """The leaves with a stored array header, and the other keys (chunks) stored per leaf."""
    # Keys name directories (``storage_dir``), not leaves: the dict key 'trailing/' is stored
    # under trailing/, the key '' at the top of the item.
    leaf_of = {storage_dir(m.name): m.name for m in tree.leaves if m.has_array}
    headers: set[str] = set()
    parts_of: dict[str, list[str]] = {}
    for key in facts.keys:
        where, part = split_key(key, facts.zarr3)
        name = leaf_of.get(where, where)
        if part == header:
            headers.add(name)
        else:
            parts_of.setdefault(name, []).append(part)
    return headers, parts_of


def _check_leaves_have_arrays(
    facts: ItemFacts, tree: TreeMetadata, headers: set[str], parts_of: dict[str, list[str]]
) -> None:
    """Every array leaf of _METADATA has its array, every stored array has its leaf."""
    store = facts.store
    assert store is not None
    metas = {m.name: m for m in tree.leaves}
    for m in tree.leaves:
        if m.has_array and m.name not in headers:
            facts.add(
                "leaf-without-array",
                f"leaf {m.name} is in _METADATA but no array is stored for it: restoring fails "
                f"or loses it; {_RESTORE}",
                leaf=m.name,
            )
        elif (
            m.skip_deserialize
            and m.value_type in ("jax.Array", "np.ndarray", "scalar")
            and m.name not in headers
        ):
            facts.add(
                "leaf-without-array",
                f"array leaf {m.name} is marked skip_deserialize and has no data: Orbax cannot "
                f"restore it; {_RESTORE}",
                leaf=m.name,
            )
        if m.value_type == "string" and m.name not in facts.strings:
            facts.add(
                "string-missing",
                f"string leaf {m.name} has no value in _strings.json; {_RESTORE}",
                leaf=m.name,
                file="_strings.json",
            )
    for name in sorted(headers - metas.keys()):
        facts.add(
            "array-without-leaf",
            f"array {name} is stored but no leaf of _METADATA names it: Orbax will not restore "
            "it (was the leaf removed from _METADATA?); restore _METADATA from a copy if the "
            "leaf should exist",
            leaf=name,
        )
    if store.layout != "zarr":  # plain zarr strays are files, flagged by the file inventory
        for name in sorted(parts_of.keys() - headers):
            facts.add(
                "chunk-unexpected",
                f"the database holds {len(parts_of[name])} chunk(s) under {name}/ but no "
                "array header: dead data that no restore reads",
                leaf=name,
            )


def _check_headers(
    facts: ItemFacts,
    names: list[str],
    metas: dict[str, LeafMeta],
    shardings: dict[str, ShardingInfo],
    array_metas: dict[str, ArrayMetadata],
    broken: set[str],
    parts_of: dict[str, list[str]],
) -> bool:
    """Read the arrays' headers and check each against its leaf, its chunks and the record; the
    sound ones go to ``facts.arrays``. False when the headers cannot be read at all."""
    store = facts.store
    assert store is not None
    header = store.header_name
    try:
        raw, errors = store.read_header_bytes(names)
    except CkptError as e:
        facts.add("unreadable", f"{e.message}; {_RESTORE}")
        return False
    for name, message in sorted(errors.items()):
        facts.add("unreadable", f"header of {name} cannot be read ({message})", leaf=name)
    rec = facts.record
    stored: list[Stored] = []
    for name, (data, label) in sorted(raw.items()):
        file = f"{name}/{header}" if store.layout == "zarr" else None
        try:
            loads_json(data, file or name)
            info = parse_zarr_header(name, data, str(store.item))
        except (ValueError, UnicodeDecodeError, InvalidMetadataError) as e:
            code = "zarr-header-invalid" if isinstance(e, InvalidMetadataError) else "json-invalid"
            facts.add(
                code,
                f"the zarr header of {name} is invalid ({first_line(e)}); {_RESTORE}",
                name,
                file,
            )
            continue
        why = size_problem(info, lambda: store.stored_bytes)
        if why is not None:
            facts.add("array-size-implausible", f"{name}: {why}; {_RESTORE}", name, file)
            continue
        facts.chunks += info.num_chunks
        ok = _check_shape(
            facts, name, info, metas[name], shardings.get(name), array_metas.get(name), file
        )
        present = _stored_chunks(facts, name, info, parts_of.get(name, []))
        stored.append((name, info, label, present, ok and name not in broken))
    settle_chunks(facts, stored, shardings, _chunks_missing)
    for name, info, *_ in stored if rec is not None else ():
        # After the chunks: a leaf partial by design (a local tier) has no digest to record.
        file = f"{name}/{header}" if store.layout == "zarr" else None
        if not _check_against_record(facts, name, info, file):
            facts.arrays.pop(name, None)
            facts.partial.pop(name, None)
    return True


def _shape_str(shape: tuple[int, ...] | None) -> str:
    return "[" + ",".join(str(d) for d in shape or ()) + "]"


def _shard_shape(
    info: ArrayInfo, sharding: ShardingInfo | None
) -> tuple[tuple[int, ...], bool] | None:
    """(shard shape, whether the array is replicated over some mesh axis) or None if unknown."""
    if sharding is None or sharding.type == "SingleDeviceSharding":
        return info.shape, False
    if sharding.mesh_shape is None or sharding.axis_names is None:
        return None
    sizes = dict(zip(sharding.axis_names, sharding.mesh_shape, strict=False))
    spec = list(sharding.partition_spec or ())
    used: set[str] = set()
    shard = []
    for d, dim in enumerate(info.shape):
        entry = spec[d] if d < len(spec) else None
        axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        used.update(axes)
        n = math.prod(sizes.get(a, 1) for a in axes)
        shard.append(-(-dim // n) if n else dim)
    replicated = any(size > 1 for a, size in sizes.items() if a not in used)
    return tuple(shard), replicated


def _check_shape(
    facts: ItemFacts,
    name: str,
    info: ArrayInfo,
    meta: LeafMeta,
    sharding: ShardingInfo | None,
    am: ArrayMetadata | None,
    file: str | None,
) -> bool:
    if am is not None and am.chunk_shape not in (None, info.chunk_shape, info.inner_chunk_shape):
        facts.add(
            "chunk-shape-mismatch",
            f"{name}: the zarr header chunks by {_shape_str(info.chunk_shape)} but "
            f"array_metadatas says {_shape_str(am.chunk_shape)}; {_RESTORE}",
            name,
            file,
        )
        return False
    write = meta.write_shape or (am.write_shape if am else None)
    if write is None:
        return True
    expected = _shard_shape(info, sharding)
    if expected is None and len(write) == len(info.shape):
        return True
    bad = len(write) != len(info.shape)
    if not bad and expected is not None:
        shard, replicated = expected
        for w, s in zip(write, shard, strict=True):
            if w > s or (not replicated and w != s) or (w and s % w):
                bad = True
    if bad:
        how = f" under {sharding.describe()}" if sharding is not None else ""
        facts.add(
            "shape-mismatch",
            f"{name}: the zarr header says shape {_shape_str(info.shape)}, which does not fit "
            f"its write_shape {_shape_str(write)}{how}: the header was changed or belongs to "
            f"another array; {_RESTORE}",
            name,
            file,
        )
    return not bad


def _stored_chunks(
    facts: ItemFacts, name: str, info: ArrayInfo, parts: list[str]
) -> frozenset[tuple[int, ...]]:
    """The chunk indices stored of a leaf; keys outside its grid are reported."""
    grid = info.chunk_grid
    present: set[tuple[int, ...]] = set()
    unexpected = []
    for part in parts:
        index = parse_chunk_part(part, facts.zarr3, len(info.shape))
        if index is None or any(i >= g for i, g in zip(index, grid, strict=True)):
            unexpected.append(part)
        else:
            present.add(index)
    if unexpected:
        facts.add(
            "chunk-unexpected",
            f"{name}: {len(unexpected)} stored chunk key(s) lie outside its chunk grid "
            f"{_shape_str(grid)} (e.g. {unexpected[0]}): was the header's shape changed?",
            name,
        )
    return frozenset(present)


def _chunks_missing(
    facts: ItemFacts, name: str, info: ArrayInfo, present: frozenset[tuple[int, ...]]
) -> None:
    missing = info.num_chunks - len(present)
    first = ", ".join(_shape_str(i) for i in expected_missing(info.chunk_grid, set(present)))
    facts.add(
        "chunk-missing",
        f"{name}: {missing} of {info.num_chunks} chunks are not stored (first: {first}). "
        "Orbax writes every chunk, so this is lost data, and a reader that fills missing "
        f"chunks would silently return zeros; {_RESTORE}",
        name,
    )


def _check_against_record(facts: ItemFacts, name: str, info: ArrayInfo, file: str | None) -> bool:
    assert facts.record is not None
    rec = facts.record.leaves.get(name)
    if rec is None and name in facts.partial:
        return True  # only some chunks here: no whole-leaf digest was recorded (``tier.py``)
    if rec is None:
        facts.add(
            "digest-incomplete",
            f"{name} has no recorded digest (added after recording?): run "
            "`ckpt verify --record` again to cover it",
            name,
        )
        return True
    ok = True
    if rec.dtype != info.dtype:
        facts.add(
            "dtype-mismatch",
            f"{name}: the zarr header says dtype {info.dtype}, the digests were recorded "
            f"for {rec.dtype}: the header was changed, so values decode wrongly; {_RESTORE}",
            name,
            file,
        )
        ok = False
    if rec.shape != info.shape:
        facts.add(
            "shape-mismatch",
            f"{name}: the zarr header says shape {_shape_str(info.shape)}, the digests "
            f"were recorded for {_shape_str(rec.shape)}; {_RESTORE}",
            name,
            file,
        )
        ok = False
    return ok


def _check_record_leaves(facts: ItemFacts, tree: TreeMetadata) -> None:
    assert facts.record is not None
    present = {m.name for m in tree.leaves if m.has_array or m.value_type == "string"}
    for name in sorted(facts.record.leaves.keys() - present):
        facts.add(
            "leaf-missing",
            f"leaf {name} was recorded in {DIGEST_FILE} but is no longer in this item: "
            f"{_RESTORE}, or record again if the removal was intended",
            name,
        )
    for name, value in sorted(facts.strings.items()):
        rec = facts.record.leaves.get(name)
        if rec is not None and not same_values(rec, string_digest(value)):
            facts.add(
                "digest-mismatch",
                f"string leaf {name} changed since its digest was recorded; {_RESTORE}",
                name,
                "_strings.json",
            )


def check_record_files(facts: ItemFacts) -> None:
    """Sizes of the files against the record (free: the inventory already has them)."""
    assert facts.record is not None and facts.inventory is not None
    inv = facts.inventory
    if not facts.record.files:
        return  # values only (ckpt_cli.orbax records at save time): no claim about the files
    for rel, rec in sorted(facts.record.files.items()):
        if not recorded_file(rel):
            continue  # recorded by an older ckpt; commit state is checked elsewhere
        size = inv.size(rel)
        if size is None:
            facts.add(
                "data-file-missing",
                f"{rel} was recorded in {DIGEST_FILE} but is missing; {_RESTORE}",
                file=rel,
            )
        elif size < rec.size:
            facts.add(
                "data-file-truncated",
                f"{rel} is {size} bytes, {rec.size} were recorded: it was cut short; {_RESTORE}",
                file=rel,
            )
        elif size != rec.size:
            facts.add(
                "datafile-checksum-mismatch",
                f"{rel} is {size} bytes, {rec.size} were recorded: its content changed; {_RESTORE}",
                file=rel,
            )
    for rel in sorted(inv.sizes.keys() - facts.record.files.keys()):
        if recorded_file(rel):
            facts.add(
                "digest-incomplete",
                f"{rel} appeared after digests were recorded: check where it came from, then "
                "run `ckpt verify --record` again",
                file=rel,
            )


def expected_missing(
    grid: tuple[int, ...], present: set[tuple[int, ...]], limit: int = 5
) -> list[tuple[int, ...]]:
    """The first few chunk indices of ``grid`` that are not in ``present``."""
    out: list[tuple[int, ...]] = []
    if 0 in grid:
        return out
    # Counted in C order by hand: itertools.product would first hold every range as a tuple.
    index = [0] * len(grid)
    while len(out) < limit:
        if tuple(index) not in present:
            out.append(tuple(index))
        d = len(grid) - 1
        while d >= 0 and index[d] == grid[d] - 1:
            index[d] = 0
            d -= 1
        if d < 0:
            break
        index[d] += 1
    return out
