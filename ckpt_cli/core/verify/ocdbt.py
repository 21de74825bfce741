"""Walk an OCDBT database the way ``verify`` needs: every node checked, every reference listed.

A sound database is decoded here (``format/ocdbt.py``: each node's CRC-32C, magic, length and
height checked; each node inside its file), a level of nodes at a time in one batched read,
without importing TensorStore (a tenth of a second of every ``verify``). Where that decoder
stops (damage, a numbered manifest, a form it does not read) TensorStore walks the database
instead, and its errors say what is damaged: ``tensorstore.ocdbt.dump`` decodes the manifest
and, given a location, one version-tree or b-tree node; decoding checks the CRC-32C footer, so
damage there surfaces as a ``DATA_LOSS`` error. Out-of-line values (chunks over
``max_inline_value_bytes``) carry no checksum: the walk only lists them as (file, offset,
length) so the caller can check that each lies inside its file and, with recorded digests,
that the bytes did not change.

A location string is ``kind:base_path:relative_path:offset:length`` with both paths
percent-encoded (tensorstore ``format/dump.cc``); ``base_path`` is relative to the database
directory: the merged root of an Orbax item points into its per-process databases
(``ocdbt.process_<id>/``, ``format/names.is_process_db``), into their ``d/`` or, saved with
metadata and values apart, their ``ocdbt_meta/`` and ``ocdbt_data/``.
"""

from __future__ import annotations

import posixpath
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from ckpt_cli.core.format.names import MANIFEST
from ckpt_cli.core.format.ocdbt import (
    MAX_HEIGHT,
    NodeRef,
    OcdbtFormatError,
    VersionNodeRef,
    decode_node,
    decode_version_node,
    item_file,
    read_manifest,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.core.verify.problems import Problem, problem
from ckpt_cli.errors import CkptError, first_line

#: Where the decoded walk stops and TensorStore's takes over (damage, forms not decoded here,
#: a read that failed).
_STOPS = (OcdbtFormatError, CkptError, ValueError)

#: Tree nodes dumped at once: enough to hide an object store's latency, few enough that the
#: version roots of a database written in many batches are not all held together.
DUMP_AHEAD = 16


@dataclass(frozen=True)
class Ref:
    """An out-of-line reference: ``length`` bytes at ``offset`` of ``file`` (item-relative)."""

    kind: str  # value | btreenode | versionnode
    file: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class OcdbtScan:
    """One database: the keys of its latest version and every reference of every version."""

    db: str  # "" for the item's merged root, else its per-process directory
    keys: dict[bytes, Ref | None]  # latest version: key -> its out-of-line value (None: inline)
    refs: tuple[tuple[Ref, bytes | None], ...]  # (reference, key of a value reference)
    problems: tuple[Problem, ...]
    complete: bool  # False when damage stopped the walk: keys may then be missing


def parse_location(text: str, db: str) -> Ref | None:
    """A dumped location as an item-relative Ref; None when malformed or outside the item."""
    parts = text.split(":")
    if len(parts) != 5 or not parts[3].isdigit() or not parts[4].isdigit():
        return None
    kind, base, rel = parts[0], unquote(parts[1]), unquote(parts[2])
    path = posixpath.normpath(posixpath.join(db, base, rel))
    if path.startswith("../") or path == ".." or posixpath.isabs(path):
        return None
    return Ref(kind, path, int(parts[3]), int(parts[4]))


def error_code(e: BaseException) -> str:
    """Map a TensorStore error (its absl status name leads the message) to a problem code."""
    text = str(e)
    if text.startswith("DATA_LOSS"):
        return "ocdbt-crc"
    if text.startswith("NOT_FOUND"):
        return "data-file-missing"
    if text.startswith("OUT_OF_RANGE"):
        return "data-file-truncated"
    return "unreadable"


class _Walk:
    def __init__(self, db: str, file_size: Callable[[str], int | None], kv: Any) -> None:
        self.db = db
        self.file_size = file_size
        self.kv = kv
        self.refs: dict[tuple[Ref, bytes | None], None] = {}  # ordered, deduplicated
        self.problems: list[Problem] = []
        self.bad_files: set[str] = set()
        self.complete = True
        self.visited: set[str] = set()

    def ref(self, text: str, key: bytes | None = None) -> Ref | None:
        r = parse_location(text, self.db)
        if r is None:
            self.complete = False
            self.problems.append(
                problem(
                    "ref-out-of-bounds",
                    f"the OCDBT database {self.db or '(merged root)'} holds the reference "
                    f"{text!r}, which is malformed or leads outside the item: the tree is "
                    "damaged; restore this step from a copy",
                    file=f"{self.db}/{MANIFEST}" if self.db else MANIFEST,
                )
            )
            return None
        self.refs[(r, key)] = None
        return r

    def readable(self, r: Ref) -> bool:
        """Whether a node reference can be dumped (its file exists and is long enough)."""
        size = self.file_size(r.file)
        if size is not None and size >= r.end:
            return True
        self.complete = False  # the caller reports the file once, from all refs into it
        return False

    def dump(self, locations: list[str]) -> Iterator[tuple[str, Any]]:
        """Dump nodes, ``DUMP_AHEAD`` at a time; damaged ones become problems.

        A database written in many batches has one root per version, each listing every key
        written so far: holding all their dumps at once would grow with the checkpoint.
        """
        import tensorstore as ts

        pending: deque[tuple[str, Any]] = deque()
        queue = iter(locations)
        while True:
            while len(pending) < DUMP_AHEAD and (loc := next(queue, None)) is not None:
                pending.append((loc, ts.ocdbt.dump(self.kv, loc)))
            if not pending:
                return
            loc, fut = pending.popleft()
            try:
                node = fut.result()
            except Exception as e:
                self.fail(e, loc)
                continue
            yield loc, node

    def fail(self, e: BaseException, where: str) -> None:
        self.complete = False
        code = error_code(e)
        r = parse_location(where, self.db)
        file = r.file if r else (f"{self.db}/{MANIFEST}" if self.db else MANIFEST)
        if file in self.bad_files:
            return
        self.bad_files.add(file)
        what = (
            "fails its CRC-32C check or does not decode" if code == "ocdbt-crc" else "is unreadable"
        )
        self.problems.append(
            problem(
                code,
                f"OCDBT node in {file} {what} ({first_line(e)}): the arrays it indexes "
                "cannot be read; restore this step from a copy",
                file=file,
            )
        )

    def nodes(self, roots: list[str], keys: dict[bytes, Ref | None] | None) -> None:
        """Breadth-first over b-tree nodes, one concurrent batch of dumps per level."""
        level = [loc for loc in roots if loc not in self.visited]
        while level:
            self.visited.update(level)
            todo = []
            for loc in level:
                r = self.ref(loc)
                if r is not None and self.readable(r):
                    todo.append(loc)
            nxt: list[str] = []
            for _, node in self.dump(todo):
                for entry in node.get("entries", []):
                    if "location" in entry:  # interior entry: a child node
                        if entry["location"] not in self.visited:
                            nxt.append(entry["location"])
                        continue
                    key = bytes(entry["key"])
                    value = None
                    if "indirect_value" in entry:
                        value = self.ref(entry["indirect_value"], key)
                    if keys is not None:
                        keys[key] = value
            level = sorted(set(nxt))


def scan_database(item: Location, db: str, file_size: Callable[[str], int | None]) -> OcdbtScan:
    """Check one OCDBT database below ``item`` (``db`` "" for the merged root): decoded here,
    through TensorStore where the decoder stops (which then says what is damaged)."""
    manifest_file = f"{db}/{MANIFEST}" if db else MANIFEST
    if file_size(manifest_file) is None:
        where = f"{db}/" if db else "the item directory"
        p = problem(
            "manifest-missing",
            f"{where} holds OCDBT data files but no {MANIFEST}: none of its arrays can be "
            "located; restore this step from a copy",
            file=manifest_file,
        )
        return OcdbtScan(db, {}, (), (p,), False)
    try:
        return scan_decoded(item, db, file_size)
    except _STOPS:
        return scan_with_tensorstore(item, db, file_size)


def scan_decoded(item: Location, db: str, file_size: Callable[[str], int | None]) -> OcdbtScan:
    """``scan_database`` of a sound database, by this process's decoder; raises
    ``OcdbtFormatError`` (or the read's ``CkptError``) where it stops."""
    return _DecodedScan(item, db, file_size).run()


_Node = TypeVar("_Node", NodeRef, VersionNodeRef)


class _DecodedScan:
    """One database walked by this process's decoder, with ``scan_with_tensorstore``'s result
    for a sound one: the latest version's tree walked first (its keys), then the trees of the
    superseded versions (their references), each node once; a superseded single-node version
    is referenced, not decoded. Raises ``_STOPS`` where anything is not as it should be."""

    def __init__(self, item: Location, db: str, file_size: Callable[[str], int | None]) -> None:
        self.item, self.db, self.file_size = item, db, file_size
        self.refs: dict[tuple[Ref, bytes | None], None] = {}
        self.seen: set[Ref] = set()
        self.keys: dict[bytes, Ref | None] = {}

    def node(self, kind: str, n: NodeRef | VersionNodeRef) -> Ref:
        """Reference a node; it must lie inside its file."""
        r = Ref(kind, item_file(self.db, n.path), n.offset, n.length)
        size = self.file_size(r.file)
        if size is None or size < r.end or n.height > MAX_HEIGHT:
            raise OcdbtFormatError("a node lies past the end of its file (or in none)")
        self.refs[(r, None)] = None
        return r

    def level(self, kind: str, nodes: Sequence[_Node]) -> list[tuple[_Node, bytes]]:
        """One level of nodes, each referenced, those not seen yet read in one batch."""
        todo = [(n, r) for n in nodes if (r := self.node(kind, n)) not in self.seen]
        self.seen.update(r for _, r in todo)
        data = self.item.read_ranges([(self.item.child(r.file), r.offset, r.end) for _, r in todo])
        if any(len(d) != r.length for d, (_, r) in zip(data, todo, strict=True)):
            raise OcdbtFormatError("a node is shorter than its reference")
        return [(n, d) for (n, _), d in zip(todo, data, strict=True)]

    def run(self) -> OcdbtScan:
        loc = self.item.child(self.db) if self.db else self.item
        inline, level, _ = read_manifest(loc.child(MANIFEST).read_bytes())
        roots = [r for r in inline[:-1] if r is not None]
        while level:  # the version tree: versions older than the manifest lists
            below: list[VersionNodeRef] = []
            for v, encoded in self.level("versionnode", level):
                deeper, older = decode_version_node(encoded, v)
                below += deeper
                roots += [r for r in older if r is not None]
            level = below
        latest = inline[-1]
        if latest is None:  # an emptied database: TensorStore's walk takes the last tree
            raise OcdbtFormatError("the latest version is empty")
        self.tree([latest], keep=True)
        for r in roots:
            if not r.height:
                self.node("btreenode", r)
        self.tree([r for r in roots if r.height], keep=False)
        return OcdbtScan(self.db, self.keys, tuple(self.refs), (), True)

    def tree(self, level: list[NodeRef], keep: bool) -> None:
        """Walk b-trees a level at a time; ``keep``: their keys are the latest version's."""
        while level:
            below: list[NodeRef] = []
            for n, encoded in self.level("btreenode", level):
                children, values = decode_node(encoded, n)
                below += children
                for key, v in values.items():
                    ref = None
                    if not isinstance(v, bytes):
                        ref = Ref("value", item_file(self.db, v[0]), v[1], v[2])
                        self.refs[(ref, key)] = None
                    if keep:
                        self.keys[key] = ref
            level = below


def scan_with_tensorstore(
    item: Location, db: str, file_size: Callable[[str], int | None]
) -> OcdbtScan:
    """``scan_database`` through ``tensorstore.ocdbt.dump``: damage becomes problems."""
    import tensorstore as ts

    loc = item.child(db) if db else item
    manifest_file = f"{db}/{MANIFEST}" if db else MANIFEST
    kv = ts.KvStore.open(loc.kvstore_spec()).result()
    walk = _Walk(db, file_size, kv)
    try:
        manifest = ts.ocdbt.dump(kv).result()
    except Exception as e:
        walk.fail(e, manifest_file)
        return OcdbtScan(db, {}, (), tuple(walk.problems), False)
    versions = list(manifest.get("versions", []))
    # Versions beyond the manifest's inline list live in version-tree nodes.
    pending = [v["location"] for v in manifest.get("version_tree_nodes", [])]
    while pending:
        level = [p for p in pending if p not in walk.visited]
        walk.visited.update(level)
        readable = [p for p in level if (r := walk.ref(p)) is not None and walk.readable(r)]
        pending = []
        for _, node in walk.dump(readable):
            for entry in node.get("entries", []):
                if "root" in entry:
                    versions.append(entry)
                elif "location" in entry:
                    pending.append(entry["location"])
    keys: dict[bytes, Ref | None] = {}
    # A database created empty (as ckpt's writers do) starts with a version whose root has no
    # location: an empty tree, nothing to reference.
    versions = [v for v in versions if "location" in v.get("root", {})]
    versions.sort(key=lambda v: int(v.get("generation_number", 0)))
    if versions:
        latest = versions[-1]
        walk.nodes([latest["root"]["location"]], keys)
        # Superseded versions: no reader reads them, but their nodes keep files referenced.
        # A single-node tree (height 0) is referenced, not decoded: it lists every key written
        # so far, and a database written in many batches has one per batch.
        older = versions[:-1]
        for v in older:
            if int(v.get("root_height", 0)) == 0:
                walk.ref(v["root"]["location"])
        walk.nodes([v["root"]["location"] for v in older if int(v.get("root_height", 0))], None)
    return OcdbtScan(db, keys, tuple(walk.refs), tuple(walk.problems), walk.complete)


def check_ref_bounds(
    scans: list[OcdbtScan], file_size: Callable[[str], int | None], leaf_of: Callable[[bytes], str]
) -> tuple[list[Problem], set[str]]:
    """One problem per data file missing or shorter than a reference; and the leaves it hurts."""
    need: dict[str, int] = {}
    leaves: dict[str, set[str]] = {}
    for scan in scans:
        for r, key in scan.refs:
            need[r.file] = max(need.get(r.file, 0), r.end)
            if key is not None:
                leaves.setdefault(r.file, set()).add(leaf_of(key))
    out = []
    broken: set[str] = set()
    for file, end in sorted(need.items()):
        size = file_size(file)
        affected = sorted(leaves.get(file, ()))
        names = ", ".join(affected[:5]) + (
            f" and {len(affected) - 5} more" if len(affected) > 5 else ""
        )
        holds = f"; it holds chunks of {names}" if affected else ""
        if size is None or size < end:
            broken.update(affected)
        if size is None:
            out.append(
                problem(
                    "data-file-missing",
                    f"OCDBT data file {file} is referenced but does not exist{holds}: "
                    "restore it (or the whole step) from a copy",
                    file=file,
                    leaves=tuple(affected),
                )
            )
        elif size < end:
            out.append(
                problem(
                    "data-file-truncated",
                    f"OCDBT data file {file} is {size} bytes but references need {end}{holds}: "
                    "the file was cut short; restore it (or the whole step) from a copy",
                    file=file,
                    leaves=tuple(affected),
                )
            )
    return out, broken
