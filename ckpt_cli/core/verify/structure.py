"""Structure checks of one item, verify's default level: metadata, arrays, chunks, OCDBT, files.

Reads metadata files, zarr headers and OCDBT tree nodes, never chunk data. The result also
carries what the deeper levels need: the readable arrays, where each chunk's bytes live and the
recorded digests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from ckpt_cli.core.digest.records import DIGEST_FILE, STATE_FILE, DigestRecord, read_digests
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.emergency import (
    GLOBAL_PROCESS_METADATA,
    MESH_METADATA,
    PROCESS_METADATA_FILES,
    PROCESS_METADATA_ITEM,
    LocalTier,
    is_process_metadata_handler,
    parse_process_metadata,
)
from ckpt_cli.core.format.items import classify
from ckpt_cli.core.format.metadata import (
    TreeMetadata,
    legacy_array_tree,
    parse_tree_metadata,
    read_array_metadatas,
    read_strings,
)
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    GRAIN_STATE_RE,
    LEGACY_MSGPACK_RE,
    MANIFEST,
    STEP_METADATA,
    TREE_METADATA,
    json_item_files,
    split_key,
    storage_dir,
)
from ckpt_cli.core.format.ocdbt import database_files, database_of
from ckpt_cli.core.format.sharding import read_shardings
from ckpt_cli.core.storage import Location
from ckpt_cli.core.verify import checks
from ckpt_cli.core.verify.inventory import take_inventory
from ckpt_cli.core.verify.ocdbt import OcdbtScan, check_ref_bounds, scan_database
from ckpt_cli.core.verify.problems import Problem
from ckpt_cli.core.verify.types import ItemFacts
from ckpt_cli.errors import CkptError, InvalidMetadataError

_PROCESS_FILE = re.compile(r"^process_\d+$")


def item_metadata_files(item: Location) -> list[Location]:
    """The small files ``check_item`` reads (from the listing: no request where it is cached)."""
    try:
        rels = [rel for rel, _ in item.walk()]
    except CkptError:
        return []
    wanted = {DIGEST_FILE, TREE_METADATA, "_sharding", "_strings.json", *json_item_files(rels)}
    return [item.child(*rel.split("/")) for rel in rels if rel in wanted or _is_process_file(rel)]


def check_item(
    item: Location,
    shown_as: str,
    boundary: Location,
    item_is_step: bool = False,
    handler: str | None = None,
    tier: LocalTier | None = None,
) -> ItemFacts:
    """Every structure check of one item (``handler``: the one its step recorded; ``tier``:
    the local tier of Orbax's emergency checkpointing its step is, or may be); never raises
    for damage, only records problems. An empty item, or one of a handler ckpt does not
    know, is checked for what its listing shows (links, unreadable entries) alone."""
    facts = ItemFacts(shown_as, handler=handler, tier=tier)
    inv = take_inventory(item, boundary, shown_as)
    facts.inventory = inv
    facts.problems.extend(inv.problems)
    facts.record = _read_record(item, facts)
    known = {COMMIT_MARKER, DIGEST_FILE, STATE_FILE} | ({STEP_METADATA} if item_is_step else set())
    if TREE_METADATA in inv.sizes:
        _check_pytree(item, facts, known)
    elif _is_process_metadata(item.name, handler, inv.sizes):
        _check_process_metadata(item, facts, known)
    elif json_files := json_item_files(inv.sizes):
        # A JsonSave item (`metadata`), the metrics item, or grain's one file per process.
        facts.kind = "json"
        json_files = json_files if GRAIN_STATE_RE.match(json_files[0]) else json_files[:1]
        for json_file in json_files:
            _parse_json(item, json_file, facts)
        _flag_unknown(facts, known | set(json_files), lambda rel: False)
    elif (
        tree := legacy_array_tree(item, frozenset(r.split("/")[0] for r in inv.sizes))
    ) is not None:
        # ArraySave before Orbax 0.12: no _METADATA, the array under `checkpoint`.
        facts.kind = "array"
        _check_tree(item, facts, known, tree, _metadata_files_parse(item, facts))
    elif (kind := classify({r.split("/")[0] for r in inv.sizes}, handler)) in ("empty", "unknown"):
        facts.kind = kind
    else:
        facts.add(
            "metadata-missing",
            f"{shown_as} has no {TREE_METADATA} (nor a JSON item file): Orbax cannot restore "
            "it; restore the file from a copy of this step",
            file=TREE_METADATA,
        )
    if facts.record is not None:
        checks.check_record_files(facts)
    facts.problems = _dedupe(facts.problems)
    return facts


def _is_process_metadata(name: str, handler: str | None, files: Collection[str]) -> bool:
    """The ``process_metadata`` item of Orbax's emergency managers' local tier."""
    if handler is not None:
        return is_process_metadata_handler(handler)
    return name == PROCESS_METADATA_ITEM and set(files) >= PROCESS_METADATA_FILES


def _check_process_metadata(item: Location, facts: ItemFacts, known: set[str]) -> None:
    """Its two JSON files: device ids per process, and the mesh's (``parse_process_metadata``)."""
    facts.kind = "json"
    global_raw = _parse_json(item, GLOBAL_PROCESS_METADATA, facts)
    mesh_raw = _parse_json(item, MESH_METADATA, facts)
    if global_raw is not None and mesh_raw is not None:
        _parsed(
            facts,
            GLOBAL_PROCESS_METADATA,
            lambda: parse_process_metadata(global_raw, mesh_raw),
            None,
        )
    _flag_unknown(facts, known | PROCESS_METADATA_FILES, lambda rel: False)


def _read_record(item: Location, facts: ItemFacts) -> DigestRecord | None:
    assert facts.inventory is not None
    if DIGEST_FILE not in facts.inventory.sizes or _parse_json(item, DIGEST_FILE, facts) is None:
        return None
    try:
        return read_digests(item)
    except InvalidMetadataError as e:
        facts.add(
            "digest-file-invalid",
            f"{e.message}: delete it and record again with `ckpt verify --record`",
            file=DIGEST_FILE,
        )
        return None


def _parse_json(item: Location, rel: str, facts: ItemFacts) -> Any | None:
    if facts.inventory is not None and rel in facts.inventory.outside:
        return None  # a link out of the checkpoint, reported as symlink-outside: never read
    try:
        return item.child(*rel.split("/")).read_json()
    except CkptError as e:
        code = "json-invalid" if isinstance(e, InvalidMetadataError) else "unreadable"
        facts.add(code, f"{e.message}: restore it from a copy of this step", file=rel)
        return None


def _parsed(facts: ItemFacts, rel: str, parse: Callable[[], Any], default: Any) -> Any:
    try:
        return parse()
    except CkptError as e:
        facts.add("metadata-invalid", f"{e.message}: restore it from a copy of this step", file=rel)
        return default


def _check_pytree(item: Location, facts: ItemFacts, known: set[str]) -> None:
    inv = facts.inventory
    assert inv is not None
    raw = _parse_json(item, TREE_METADATA, facts)
    tree: TreeMetadata | None = None
    if raw is not None:
        tree = _parsed(
            facts, TREE_METADATA, lambda: parse_tree_metadata(raw, item.child(TREE_METADATA)), None
        )
    meta_ok = _metadata_files_parse(item, facts)
    if tree is None:
        return  # without the tree nothing else can be matched; the file problem says it all
    if tree.use_ocdbt is None:
        # Orbax 0.4/0.5 wrote the tree also as msgpack, `checkpoint` (placeholders for arrays),
        # next to _METADATA; 0.12 records use_ocdbt and writes no such file.
        known = known | {n for n in inv.sizes if LEGACY_MSGPACK_RE.match(n)}
    _check_tree(item, facts, known, tree, meta_ok)


def _metadata_files_parse(item: Location, facts: ItemFacts) -> bool:
    assert facts.inventory is not None
    return all(
        _parse_json(item, rel, facts) is not None
        for rel in sorted(facts.inventory.sizes)
        if rel in ("_sharding", "_strings.json") or _is_process_file(rel)
    )


def _scan_databases(
    item: Location, facts: ItemFacts, store: ItemStore, leaf_of: dict[str, str]
) -> tuple[list[OcdbtScan], set[str], set[str], bool]:
    """Walk the item's OCDBT databases (the merged root, every per-process one whatever its
    name): their problems and keys go to ``facts``; returns the scans, the data files they
    reference, the leaves whose chunks point past a file's end, and whether the keys were all
    read."""
    inv = facts.inventory
    assert inv is not None
    scans: list[OcdbtScan] = []
    referenced: set[str] = set()
    if MANIFEST in inv.sizes or any(database_of(rel) == "" for rel in inv.sizes):
        scans.append(scan_database(item, "", inv.size))
    scans.extend(scan_database(item, db, inv.size) for db in store.process_dbs)
    for scan in scans:
        facts.problems.extend(_shown(facts, p) for p in scan.problems)
        referenced.update(r.file for r, _ in scan.refs)
    bounds, broken = check_ref_bounds(
        scans, inv.size, lambda k: _leaf_of_key(k, leaf_of, facts.zarr3)
    )
    facts.problems.extend(_shown(facts, p) for p in bounds)
    key_scans = [s for s in scans if s.db == ""] if MANIFEST in inv.sizes else scans
    for scan in reversed(key_scans):
        facts.keys.update(scan.keys)
    return scans, referenced, broken, all(s.complete for s in key_scans) and bool(key_scans)


def _check_tree(
    item: Location, facts: ItemFacts, known: set[str], tree: TreeMetadata, meta_ok: bool
) -> None:
    """Arrays, chunks, databases and files of an item against its tree (parsed, or for an
    ArraySave of before 0.12 known by heart)."""
    inv = facts.inventory
    assert inv is not None
    facts.zarr3 = tree.use_zarr3
    facts.leaves = [m.name for m in tree.leaves]
    shardings = _parsed(facts, "_sharding", lambda: read_shardings(item), {}) if meta_ok else {}
    array_metas = (
        _parsed(facts, "array_metadatas", lambda: read_array_metadatas(item), {}) if meta_ok else {}
    )
    if any(m.value_type == "string" for m in tree.leaves) and "_strings.json" in inv.sizes:
        facts.strings = _parsed(facts, "_strings.json", lambda: read_strings(item), {})
    facts.store = store = ItemStore(item, tree.use_zarr3)
    scans: list[OcdbtScan] = []
    complete, broken = True, set[str]()
    referenced: set[str] = set()
    # Keys are named after storage directories; the dict key '' keeps its array at the top.
    leaf_of = {storage_dir(m.name): m.name for m in tree.leaves if m.has_array}
    top_array = "" in leaf_of
    if store.layout == "zarr":
        # Orbax opens no database for an item without array or scalar leaves (strings, None,
        # empty containers: a Keras `model_config`), use_ocdbt or not.
        if tree.use_ocdbt and leaf_of:
            facts.add(
                "manifest-missing",
                f"{TREE_METADATA} says use_ocdbt but the item holds no OCDBT database: the "
                "arrays are gone; restore this step from a copy",
                file=MANIFEST,
            )
            complete = False
        facts.keys = {
            rel.encode(): None
            for rel in inv.sizes
            if "/" in rel or (top_array and _array_file("", rel, store.header_name, tree.use_zarr3))
        }
    else:
        scans, referenced, broken, complete = _scan_databases(item, facts, store, leaf_of)
    if complete:
        checks.check_arrays(facts, tree, shardings, array_metas, broken)
    # Unreferenced data files are named only where every database was read to its end: a
    # damaged one may reference files its walk never reached.
    trust_refs = complete and bool(scans) and all(s.complete for s in scans)
    _flag_unknown(
        facts,
        known | {TREE_METADATA, "_sharding", "_strings.json", MANIFEST},
        lambda rel: (
            _is_process_file(rel)
            or (store.layout == "zarr" and _in_array(rel, facts.arrays_seen, store, tree))
            or _ocdbt_file(rel, referenced, facts, trust_refs)
        ),
    )


def _leaf_of_key(key: bytes, leaf_of: dict[str, str], zarr3: bool) -> str:
    where = split_key(key, zarr3)[0]
    return leaf_of.get(where, where)


def _array_file(directory: str, rel: str, header: str, zarr3: bool) -> bool:
    """Whether ``rel`` is the header or a chunk of the plain array kept in ``directory``."""
    if directory:
        if not rel.startswith(directory + "/"):
            return False
        rel = rel[len(directory) + 1 :]
    return rel == header or (split_key(rel.encode(), zarr3)[0] == "" and _chunk_like(rel, zarr3))


def _chunk_like(part: str, zarr3: bool) -> bool:
    if zarr3:
        return part == "c" or part.startswith("c/")
    return "/" not in part and all(p.isdigit() for p in part.split("."))


def _in_array(rel: str, seen: set[str], store: ItemStore, tree: TreeMetadata) -> bool:
    """Whether a file of a plain item lies in the directory of a stored array."""
    if "" in seen and _array_file("", rel, store.header_name, tree.use_zarr3):
        return True
    parts = rel.split("/")
    return any("/".join(parts[:i]) in seen for i in range(1, len(parts)))


def _shown(facts: ItemFacts, p: Problem) -> Problem:
    if p.file is None or facts.shown_as in ("", "."):
        return p
    return replace(p, file=f"{facts.shown_as}/{p.file}")


def _is_process_file(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 2 and parts[0] == "array_metadatas" and bool(_PROCESS_FILE.match(parts[1]))


def _ocdbt_file(rel: str, referenced: set[str], facts: ItemFacts, trust_refs: bool) -> bool:
    """Whether ``rel`` is a file of an OCDBT database (its manifest, a data file in ``d/`` or
    the split ``ocdbt_meta/``, ``ocdbt_data/``; ``format/ocdbt.database_files``), or any file a
    database references (Orbax reads it: never called unknown). Data files no version of any
    database references are flagged, as ``du`` counts them garbage."""
    if rel in referenced:
        return True
    db = database_files(rel)
    if db is None:
        return False
    if database_of(rel) is not None and trust_refs:
        if db:
            # A per-process database of a clean save can hold one: the tree nodes of a write
            # that lost a commit race to another write of the same save (v1 API, jax.Array and
            # NumPy leaves together), which TensorStore retried and never referenced. Dead
            # weight (what ``du`` counts as garbage), named, but no problem: never a false alarm.
            facts.unreferenced.append(rel)
            return True
        facts.add(
            "unreferenced-file",
            f"OCDBT data file {rel} is referenced by no version of any database of the item: "
            "nothing reads it, it is dead weight (an interrupted write?); it can be deleted",
            file=rel,
        )
    return True


def _flag_unknown(facts: ItemFacts, known: set[str], also_known: Callable[[str], bool]) -> None:
    assert facts.inventory is not None
    for rel in sorted(facts.inventory.sizes):
        if (
            rel in known
            or rel.startswith((DIGEST_FILE + ".tmp-", STATE_FILE + ".tmp-"))
            or also_known(rel)
        ):
            continue
        facts.add(
            "unknown-file",
            f"{rel} is not a file Orbax writes into an item: Orbax ignores it; remove it, or "
            "keep it knowing that restores do not see it",
            file=rel,
        )


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str | None, str | None]] = set()
    out = []
    for p in problems:
        key = (p.code, p.leaf, p.file)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out
