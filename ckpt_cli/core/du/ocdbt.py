"""Attribute an OCDBT item's bytes to its leaves, and find the bytes no version reads.

One walk of every database of the item (the merged root and every per-process database,
whatever its name: ``ocdbt.process_<id>``, ``ocdbt.process_replica_<id>``, a v1 partial save's
renamed ``ocdbt.process_0<uuid hex>``; ``format/ocdbt.item_databases``),
decoded here (``format/ocdbt.py``): every manifest in one batched read, then the b-tree nodes
of every version a level at a time, each node read once, with the version tree nodes that hold
the versions older than a manifest lists (more than 16 commits); ``walk_items`` walks many
items side by side, each level of all of them in one batched read. The latest version gives every key's
value (inline bytes, or a data file range), which the leaves are made of; every version gives
the data files it references and its nodes' bytes. Superseded single-node versions are
referenced, not decoded (as ``verify/ocdbt.scan_database`` does). Where this decoder stops (a
numbered manifest, damage), TensorStore walks the item instead
(``scan_with_tensorstore``), and says what is damaged.

A data file of a database (below its ``d/``, or its split ``ocdbt_meta/`` and ``ocdbt_data/``:
``format/ocdbt.database_of``) that no version of any database references is garbage. So are the
bytes of a referenced data file that no value of the latest version and no node of any
version covers: the values only older versions read (a rewrite in place leaves them). The
latest version is the merged root's where there is one (what Orbax and TensorStore open; the
per-process databases are where its data files live), else each per-process database's. The
b-tree nodes of older versions are metadata, not garbage: every Orbax save commits several
versions (one per batch of writes), each with its own root node. When a walk cannot finish
(damage), no garbage is reported for the item: never a false alarm.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ckpt_cli.core.format.names import MANIFEST, is_process_db
from ckpt_cli.core.format.ocdbt import (
    DATA_DIRS,
    MAX_HEIGHT,
    NodeRef,
    OcdbtFormatError,
    Value,
    VersionNodeRef,
    database_of,
    decode_node,
    decode_version_node,
    item_databases,
    item_file,
    read_manifest,
    read_values,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError

#: (item-relative file, offset, length)
Range = tuple[str, int, int]
#: Where this decoder stops (damage, a form it does not read), or a read fails.
_STOPS = (OcdbtFormatError, CkptError, ValueError)


@dataclass
class ItemDatabases:
    """What the walks found in one item."""

    values: dict[bytes, Value | Range] = field(default_factory=dict)  # latest keys
    unreferenced: list[str] = field(default_factory=list)  # data files no version names
    unused: dict[str, int] = field(default_factory=dict)  # referenced file -> bytes not live
    exact: bool = True
    note: str | None = None


def databases(files: Iterable[str]) -> list[str]:
    """The databases of an item, as ``scan_database`` labels them: ``""`` for the merged root."""
    return item_databases(list(files))


def is_ocdbt(files: Iterable[str]) -> bool:
    return bool(databases(files))


#: A merged root's data file no larger than this is read whole with the manifests
#: (``first_reads``), ...
NODE_FILE_BYTES = 1 << 20
#: ... until the files so read hold this many bytes: past it, the walk reads their nodes.
FIRST_READ_BYTES = 32 << 20


def _beside(rel: str) -> str | None:
    """The item directory ("" or ending in "/") of a per-process database's manifest ``rel``
    (a path below ``du``'s path); None for any other file."""
    head, _, name = rel.rpartition("/")
    if name != MANIFEST or not is_process_db(head.rpartition("/")[2]):
        return None
    item = head.rpartition("/")[0]
    return item + "/" if item else ""


def item_dirs(files: Iterable[str]) -> set[str]:
    """The directories of the OCDBT items among ``files`` ("" or ending in "/")."""
    out = set()
    for rel in files:
        if (item := _beside(rel)) is not None:
            out.add(item)
        elif rel.rpartition("/")[2] == MANIFEST:
            out.add(rel[: -len(MANIFEST)])
    return out


def _merged_node_file(rel: str, merged: set[str]) -> bool:
    """Whether ``rel`` is a data file of the merged root of an item of ``merged``."""
    head, _, name = rel.rpartition("/")
    item, _, data_dir = head.rpartition("/")
    return bool(name) and data_dir in DATA_DIRS and (item + "/" if item else "") in merged


def first_reads(files: dict[str, int]) -> list[str]:
    """What ``du`` reads before any walk, all at once (``files``: every file under the path,
    with its size): every manifest, and the data files of each merged root beside per-process
    databases. Those hold only the merged root's b-tree nodes (its values point into the
    per-process databases), which the walk reads next: read whole in the same wave, they cost
    no round trip of their own (three reads a step in one wave, not two waves)."""
    merged = {
        item for rel in files if (item := _beside(rel)) is not None and item + MANIFEST in files
    }
    out = [rel for rel in files if rel.rpartition("/")[2] == MANIFEST]
    budget = FIRST_READ_BYTES
    for rel, size in files.items():
        if size <= min(NODE_FILE_BYTES, budget) and _merged_node_file(rel, merged):
            out.append(rel)
            budget -= size
    return out


def _latest(item: Location, db: str) -> dict[bytes, Value | Range]:
    """The latest version of one database: its keys' values, ranges item-relative."""
    base = f"{db}/" if db else ""
    loc = item.child(db) if db else item

    def fetch(refs: list[tuple[str, int, int]]) -> list[bytes]:
        return item.read_ranges([(loc.child(p), o, o + n) for p, o, n in refs])

    values = read_values(loc.child(MANIFEST).read_bytes(), fetch)
    return {k: v if isinstance(v, bytes) else (base + v[0], v[1], v[2]) for k, v in values.items()}


def _covered(ranges: list[tuple[int, int]]) -> int:
    """Bytes covered by [start, end) ranges, overlaps counted once."""
    total, reach = 0, 0
    for start, end in sorted(ranges):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _garbage(
    out: ItemDatabases,
    dbs: list[str],
    files: dict[str, int],
    referenced: set[str],
    live: dict[str, list[tuple[int, int]]],
) -> bool:
    """Fill ``out``'s garbage from what the walks referenced; False (nothing filled) for a
    damaged item: a directory of data files without its manifest, or a node or value past the
    end of its file (or in a missing one), whose unreferenced bytes are no garbage to delete."""
    holders = {db for name in files if (db := database_of(name)) is not None}
    if not holders <= set(dbs) or any(
        files.get(file, -1) < max(end for _, end in spans) for file, spans in live.items()
    ):
        return False
    for name, size in sorted(files.items()):
        if database_of(name) is None:
            continue
        if name not in referenced:
            out.unreferenced.append(name)
        elif (unused := size - _covered(live.get(name, []))) > 0:
            out.unused[name] = unused
    return True


def walk_item(item: Location, files: dict[str, int]) -> ItemDatabases:
    """Walk every database of ``item`` (``files``: its files, item-relative, with sizes):
    decoded here, each manifest and node read once; through TensorStore where this decoder
    stops (damage, a numbered manifest), which says what it found."""
    try:
        return _walk_decoded(item, files)
    except _STOPS:
        return _walk_tensorstore(item, files)


def walk_cached(item: Location, files: dict[str, int]) -> ItemDatabases | None:
    """``walk_item`` where every read it needs is held already (``Location.cached``: a sound
    item whose ``first_reads`` are in), without a request; None where it would need one (a
    deeper tree, versions past the manifest's, a fetch that failed) or where the decoder
    stops: ``walk_item`` then walks it, and says what is wrong."""
    names = [f"{db}/{MANIFEST}" if db else MANIFEST for db in databases(files)]
    try:
        if item.cached([(item.child(n), 0, files[n]) for n in names]) is None:
            return None
        walk = _ItemWalk(item, files)
        while not walk.done:
            data = item.cached(walk.reads())
            if data is None:
                return None
            walk.take(data)
        return walk.result()
    except _STOPS:
        return None


def _walk_tensorstore(item: Location, files: dict[str, int]) -> ItemDatabases:
    # This walk's own decoder stopped already: TensorStore's, which says what it found.
    from ckpt_cli.core.verify.ocdbt import scan_with_tensorstore

    out = ItemDatabases()
    dbs = databases(files)
    referenced: set[str] = set()
    live: dict[str, list[tuple[int, int]]] = {}
    scans_complete = True
    for db in dbs:
        scan = scan_with_tensorstore(item, db, files.get)
        scans_complete &= scan.complete and not scan.problems
        for ref, _ in scan.refs:
            referenced.add(ref.file)
            if ref.kind != "value":  # nodes of every version: metadata
                live.setdefault(ref.file, []).append((ref.offset, ref.end))
        if db and "" in dbs:
            continue  # readers open the merged root: its values are the live ones
        try:
            values = _latest(item, db)
        except _STOPS:
            # A manifest this decoder does not read (numbered manifests): TensorStore's keys,
            # whose inline values have no length here (those leaves count 0 bytes).
            out.exact = False
            values = {
                k: (r.file, r.offset, r.length) if r is not None else b""
                for k, r in scan.keys.items()
            }
        for key, v in values.items():
            if not isinstance(v, bytes):
                live.setdefault(v[0], []).append((v[1], v[1] + v[2]))
            out.values[key] = v
    if not scans_complete or not _garbage(out, dbs, files, referenced, live):
        out.exact = False
        out.note = "the OCDBT database is damaged (`ckpt verify` says where): no garbage reported"
        return out
    if not out.exact:
        out.note = "OCDBT manifest read through TensorStore: inline chunks count 0 bytes"
    return out


#: (database, node, whether its values are the live ones) for one level of the walk.
_Todo = tuple[str, NodeRef, bool]


class _Decoded:
    """The state of a decoded walk: what is referenced, what is live, the latest values."""

    def __init__(self, files: dict[str, int]) -> None:
        self.files = files
        self.referenced: set[str] = set()
        self.live: dict[str, list[tuple[int, int]]] = {}
        self.values: dict[bytes, Value | Range] = {}
        self.seen: dict[tuple[str, int, int], bool] = {}

    def node_ref(self, db: str, node: NodeRef | VersionNodeRef) -> tuple[str, int, int]:
        """Note a node's bytes (a b-tree's, a version tree's) as referenced metadata: (file,
        offset, length)."""
        file = item_file(db, node.path)
        if self.files.get(file, -1) < node.offset + node.length:
            raise OcdbtFormatError("a node lies past the end of its file (or in none)")
        self.referenced.add(file)
        self.live.setdefault(file, []).append((node.offset, node.offset + node.length))
        return (file, node.offset, node.length)

    def plan(self, todo: list[_Todo]) -> list[tuple[_Todo, tuple[str, int, int]]]:
        """The nodes of one level still to read: each once, live trees first."""
        batch: list[tuple[_Todo, tuple[str, int, int]]] = []
        for db, node, keep in sorted(todo, key=lambda t: not t[2]):
            ref = self.node_ref(db, node)
            if self.seen.get(ref, False) or (ref in self.seen and not keep):
                continue
            self.seen[ref] = keep
            batch.append(((db, node, keep), ref))
        return batch

    def take(
        self, batch: list[tuple[_Todo, tuple[str, int, int]]], data: list[bytes]
    ) -> list[_Todo]:
        """Decode one level's nodes (``data``: the bytes ``plan`` asked for); the level below."""
        below: list[_Todo] = []
        for ((db, node, keep), _), encoded in zip(batch, data, strict=True):
            if len(encoded) != node.length or node.height > MAX_HEIGHT:
                raise OcdbtFormatError("node shorter than its reference")
            children, values = decode_node(encoded, node)
            below += [(db, c, keep) for c in children]
            for key, v in values.items():
                if not isinstance(v, bytes):
                    v = (item_file(db, v[0]), v[1], v[2])
                    self.referenced.add(v[0])
                    if keep:
                        self.live.setdefault(v[0], []).append((v[1], v[1] + v[2]))
                if keep:
                    self.values[key] = v
        return below


class _ItemWalk:
    """One item's decoded walk, a level at a time: ``reads`` says what the next level needs,
    ``take`` decodes it. Every manifest of the item first (``disk_usage`` fetched them all at
    once), then the b-tree nodes of every version (all databases together): each node read
    once. Superseded single-node versions are referenced, not decoded (as ``scan_database``).
    The latest single-node version of a per-process database beside a merged root is decoded
    only when a data file is left unreferenced: its values can only add references (a merged
    root's values, its nodes' and the versions' root nodes reference every data file of a
    sound save), so a sound save costs one read less per process."""

    def __init__(self, item: Location, files: dict[str, int]) -> None:
        self.item, self.files = item, files
        self.dbs = databases(files)
        names = [f"{db}/{MANIFEST}" if db else MANIFEST for db in self.dbs]
        manifests = [item.child(n).read_bytes() for n in names]  # prefetched on a bucket
        self.walk = _Decoded(files)
        self.todo: list[_Todo] = []
        self.later: list[_Todo] = []
        #: Version tree nodes still to read (versions older than a manifest holds).
        self.versions: list[tuple[str, VersionNodeRef]] = []
        #: Keys of the live latest versions (their statistics): what the walk will hold.
        self.keys = 0
        for db, manifest in zip(self.dbs, manifests, strict=True):
            inline, nodes, keys = read_manifest(manifest)
            self.versions += [(db, v) for v in nodes]
            roots = [r for r in inline if r is not None]
            if not roots:
                continue
            *older, latest = roots
            live = not db or "" not in self.dbs
            self.keys += keys if live else 0
            if live or latest.height:
                self.todo.append((db, latest, live))
            else:
                self.walk.node_ref(db, latest)
                self.later.append((db, latest, False))
            self._older(db, older)
        self._batch: list[tuple[_Todo, tuple[str, int, int]]] = []
        self._vbatch: list[tuple[tuple[str, VersionNodeRef], tuple[str, int, int]]] = []
        self._next()

    def _older(self, db: str, roots: Iterable[NodeRef | None]) -> None:
        """Superseded versions: their trees are walked, a single node only referenced."""
        for r in roots:
            if r is not None and r.height:
                self.todo.append((db, r, False))
            elif r is not None:
                self.walk.node_ref(db, r)

    def _next(self) -> None:
        """Plan the next level (b-tree and version tree nodes together); once both are done,
        the deferred latest versions where a data file is still unreferenced."""
        while True:
            if not self.todo and not self.versions and self.later:
                data = [n for n in self.files if database_of(n) is not None]
                if not self.walk.referenced.issuperset(data):
                    self.todo = self.later
                self.later = []
            self._batch, self.todo = self.walk.plan(self.todo), []
            self._vbatch = []
            for db, v in self.versions:
                ref = self.walk.node_ref(db, v)
                if ref not in self.walk.seen:
                    self.walk.seen[ref] = False
                    self._vbatch.append(((db, v), ref))
            self.versions = []
            if self._batch or self._vbatch or not self.later:
                return

    @property
    def done(self) -> bool:
        return not self._batch and not self._vbatch

    def reads(self) -> list[tuple[Location, int, int]]:
        nodes = [ref for _, ref in self._batch] + [ref for _, ref in self._vbatch]
        return [(self.item.child(f), o, o + n) for f, o, n in nodes]

    def take(self, data: list[bytes]) -> None:
        n = len(self._batch)
        self.todo = self.walk.take(self._batch, data[:n])
        for ((db, v), _), encoded in zip(self._vbatch, data[n:], strict=True):
            if len(encoded) != v.length or v.height > MAX_HEIGHT:
                raise OcdbtFormatError("version node shorter than its reference")
            below, roots = decode_version_node(encoded, v)
            self.versions += [(db, b) for b in below]
            self._older(db, roots)
        self._next()

    def result(self) -> ItemDatabases:
        out = ItemDatabases(values=self.walk.values)
        if not _garbage(out, self.dbs, self.files, self.walk.referenced, self.walk.live):
            raise OcdbtFormatError("damaged: TensorStore's walk says where")
        return out


def _walk_decoded(item: Location, files: dict[str, int]) -> ItemDatabases:
    """One item's decoded walk, each level one batched read; raises where the decoder stops."""
    walk = _ItemWalk(item, files)
    while not walk.done:
        walk.take(item.read_ranges(walk.reads()))
    return walk.result()


class ItemWalks:
    """Items walked side by side (``walk_item`` of each): each level of every item's b-trees
    and version trees in one ``read_ranges`` on ``where``'s store (on a bucket, as many in
    flight as it takes, instead of one item's few nodes at a time). An item where the decoder
    stops, or whose read fails, is walked again on its own (``walk_item``: its own reads,
    TensorStore where the decoder stops), which says what is wrong."""

    def __init__(self, where: Location) -> None:
        self.where = where
        self.items: list[tuple[Location, dict[str, int]]] = []
        self._walks: dict[int, _ItemWalk] = {}

    def add(self, item: Location, files: dict[str, int]) -> int:
        """Add an item (its manifests read, prefetched on a bucket); the keys its walk will
        hold (its latest version's statistics; 0 where the decoder stops at once)."""
        self.items.append((item, files))
        try:
            walk = _ItemWalk(item, files)
        except _STOPS:
            return 0
        self._walks[len(self.items) - 1] = walk
        return walk.keys

    def run(self) -> list[ItemDatabases]:
        """Every item's walk, in the order added."""
        walks = self._walks
        active = [i for i, w in walks.items() if not w.done]
        while active:
            asked = {i: walks[i].reads() for i in active}
            try:
                data = self.where.read_ranges([r for i in active for r in asked[i]])
            except CkptError:
                for i in active:
                    del walks[i]
                break
            at = 0
            for i in active:
                n = len(asked[i])
                try:
                    walks[i].take(data[at : at + n])
                except _STOPS:
                    del walks[i]
                at += n
            active = [i for i in active if i in walks and not walks[i].done]
        out: list[ItemDatabases] = []
        for i, (item, files) in enumerate(self.items):
            try:
                out.append(walks[i].result() if i in walks else walk_item(item, files))
            except _STOPS:
                out.append(walk_item(item, files))
        return out


def walk_items(
    where: Location, items: Sequence[tuple[Location, dict[str, int]]]
) -> list[ItemDatabases]:
    """``walk_item`` of each item, side by side (``ItemWalks``)."""
    walks = ItemWalks(where)
    for item, files in items:
        walks.add(item, files)
    return walks.run()
