"""Read an OCDBT database's latest keys and small values without TensorStore.

The format is TensorStore's (``tensorstore/kvstore/ocdbt/index.rst``): ``manifest.ocdbt`` holds
the configuration and the latest versions; a version names its root b-tree node as (data file,
offset, length); interior nodes name their children the same way, and leaf nodes hold each key
with its value inline (up to ``max_inline_value_bytes``, 1,024 for Orbax) or a reference to it.
Every encoded node is ``magic (u32be), length (u64le), version, compression`` + body (zstd or
raw) + a CRC-32C footer. Varints are LEB128. A manifest lists the latest versions inline (up to
``2**version_tree_arity_log2``, 16 by default) and names version tree nodes for the older ones:
interior nodes name version nodes, leaf nodes list versions as the manifest does
(``read_manifest``, ``decode_version_node``: ``du`` walks every version).

``inspect`` needs only the zarr headers (and one scalar) of an item, all inline in a few leaf
nodes: reading those nodes level by level, all of a level at once, costs a handful of ranged
GETs and no import of TensorStore. Anything unexpected (a numbered manifest, a bad checksum, an
unknown compression) raises ``OcdbtFormatError``; callers then read through TensorStore, which
reports damage in its own words.

An item's databases: the merged root at the item directory, and per-process databases in
directories ``names.is_process_db`` names. A database keeps its nodes and out-of-line values in
``d/``, or (Orbax's ``store_ocdbt_metadata_and_values_separately``, 0.12.x
``serialization/tensorstore_utils.py``) its b-tree and version nodes in ``ocdbt_meta/`` and its
values in ``ocdbt_data/``: ``database_of`` tells a data file of any of them.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ckpt_cli.core.format.codecs import crc32c_matches, zstd_decompress
from ckpt_cli.core.format.names import MANIFEST, is_process_db

MANIFEST_MAGIC = 0x0CDB3A2A
BTREE_MAGIC = 0x0CDB20DE
VERSION_MAGIC = 0x0CDB1234
#: Offset and length of a version's root when its tree is empty (TensorStore's "missing").
_MISSING = (1 << 64) - 1
MAX_HEIGHT = 64


#: The directories of a database that hold its data files: TensorStore's default ``d/``, and
#: Orbax's split ones (nodes in ``ocdbt_meta/``, values in ``ocdbt_data/``).
DATA_DIRS = frozenset({"d", "ocdbt_meta", "ocdbt_data"})


def database_of(rel: str) -> str | None:
    """The database holding ``rel`` (item-relative) as a data file: ``""`` for the item's
    merged root, else its per-process directory; None where ``rel`` is no data file."""
    parts = rel.split("/")
    if len(parts) == 2 and parts[0] in DATA_DIRS:
        return ""
    if len(parts) == 3 and parts[1] in DATA_DIRS and is_process_db(parts[0]):
        return parts[0]
    return None


def database_files(rel: str) -> str | None:
    """The database ``rel`` (item-relative) is a file of, its manifest or a data file:
    ``""`` for the merged root, else its per-process directory; None for any other file."""
    if rel == MANIFEST:
        return ""
    head, _, name = rel.partition("/")
    if name == MANIFEST and is_process_db(head):
        return head
    return database_of(rel)


def item_databases(files: Collection[str]) -> list[str]:
    """The databases of an item whose files (item-relative) are ``files``, those with a
    manifest: ``""`` for the merged root first, then the per-process ones, sorted."""
    dbs = {
        db for rel in files if rel.endswith(MANIFEST) and (db := database_files(rel)) is not None
    }
    return sorted(dbs)


class OcdbtFormatError(ValueError):
    """The database is not what this reader decodes (the caller uses TensorStore instead)."""


@dataclass(frozen=True)
class NodeRef:
    """``length`` bytes at ``offset`` of ``path`` (relative to the database directory)."""

    path: str
    offset: int
    length: int
    height: int
    #: What the path of every data file named below this node starts with (OCDBT's
    #: "transitive path": a merged root's ``ocdbt.process_0/``).
    base: str
    #: The bytes every key below this node starts with.
    prefix: bytes


@dataclass(frozen=True)
class VersionNodeRef:
    """A version tree node: ``length`` bytes at ``offset`` of ``path``, holding older versions'
    root nodes (``height`` 0) or version nodes below it."""

    path: str
    offset: int
    length: int
    height: int
    base: str


#: A value: its bytes (inline) or where they are (path, offset, length).
Value = bytes | tuple[str, int, int]
#: Fetches (path, offset, length) ranges, many at once: the bytes of each, in order.
Fetch = Callable[[list[tuple[str, int, int]]], list[bytes]]


def item_file(db: str, path: str) -> str:
    """An item-relative file name from a path relative to database ``db`` (``""``: the item's
    merged root, else a per-process directory); ``OcdbtFormatError`` where it leads out of the
    item."""
    out = posixpath.normpath(posixpath.join(db, path))
    if out.startswith("../") or out == ".." or posixpath.isabs(out):
        raise OcdbtFormatError("a data file path leads out of the item")
    return out


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        out, shift = 0, 0
        while True:
            if self.pos >= len(self.data) or shift > 63:
                raise OcdbtFormatError("truncated varint")
            b = self.data[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def byte(self) -> int:
        return self.take(1)[0]

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise OcdbtFormatError("truncated node")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def varints(self, n: int) -> list[int]:
        out: list[int] = []
        append = out.append
        data, pos, end = self.data, self.pos, len(self.data)
        for _ in range(n):
            b = data[pos] if pos < end else 0x80
            if b < 0x80:  # one byte: most lengths, ids and counts
                append(b)
                pos += 1
            elif pos + 1 < end and data[pos + 1] < 0x80:  # two: most offsets
                append((b & 0x7F) | (data[pos + 1] << 7))
                pos += 2
            else:
                self.pos = pos
                append(self.varint())
                pos = self.pos
        self.pos = pos
        return out


def _body(encoded: bytes, magic: int) -> _Reader:
    """The decoded body of an encoded manifest or node, its header and checksum checked."""
    if len(encoded) < 18 or struct.unpack(">I", encoded[:4])[0] != magic:
        raise OcdbtFormatError("bad magic")
    if struct.unpack("<Q", encoded[4:12])[0] != len(encoded):
        raise OcdbtFormatError("length does not match")
    if not crc32c_matches(encoded):
        raise OcdbtFormatError("checksum does not match")
    head = _Reader(encoded[:-4])
    head.pos = 12
    if head.varint() != 0:
        raise OcdbtFormatError("unknown format version")
    compression = head.varint()
    rest = encoded[head.pos : -4]
    if compression == 0:
        return _Reader(rest)
    if compression == 1:
        body = zstd_decompress(rest)
        if body is None:
            raise OcdbtFormatError("cannot decode zstd")
        return _Reader(body)
    raise OcdbtFormatError("unknown compression")


def _data_files(r: _Reader, transitive: str) -> list[tuple[str, str]]:
    """A data file table: (base path, relative path) of each file, base paths transitive."""
    n = r.varint()
    prefixes = [0, *r.varints(max(0, n - 1))][:n]
    suffixes = r.varints(n)
    bases = r.varints(n)
    paths = _unprefixed(r, prefixes, suffixes)
    out = []
    for path, base_len in zip(paths, bases, strict=True):
        if base_len > len(path):
            raise OcdbtFormatError("bad data file table")
        text = path.decode()
        if text.startswith("/") or ".." in text.split("/"):
            raise OcdbtFormatError("a data file path leads out of the database")
        out.append((transitive + text[:base_len], text[base_len:]))
    return out


def _refs(r: _Reader, files: list[tuple[str, str]], n: int) -> list[tuple[str, str, int, int]]:
    """``n`` indirect references: (base, full path, offset, length)."""
    ids = r.varints(n)
    offsets = r.varints(n)
    lengths = r.varints(n)
    out = []
    for i, off, length in zip(ids, offsets, lengths, strict=True):
        if off == length == _MISSING:  # an empty version's root: no file
            out.append(("", "", off, length))
            continue
        if i >= len(files):
            raise OcdbtFormatError("data file id out of range")
        base, rel = files[i]
        out.append((base, base + rel, off, length))
    return out


def _leaf_entries(
    r: _Reader, files: list[tuple[str, str]], keys: list[int] | None = None
) -> list[NodeRef | None]:
    """Version tree leaf entries (a manifest's inline versions, a leaf version node's): the
    root node of each version, oldest first (None: the empty tree); ``keys`` gets each
    version's number of keys (its statistics)."""
    n = r.varint()
    if n == 0:
        raise OcdbtFormatError("no version")
    r.varints(n)  # generation numbers
    heights = list(r.take(n))
    roots: list[NodeRef | None] = [
        None
        if (offset == length == _MISSING) or not (path or length)
        else NodeRef(path, offset, length, height, base, b"")
        for (base, path, offset, length), height in zip(_refs(r, files, n), heights, strict=True)
    ]
    counts = r.varints(n)  # statistics: keys, then tree bytes and indirect value bytes
    r.varints(2 * n)
    r.take(8 * n)  # commit times (uint64le)
    if keys is not None:
        keys += counts
    return roots


def _interior_entries(
    r: _Reader, files: list[tuple[str, str]], height: int | None
) -> list[VersionNodeRef]:
    """Version tree interior entries: the version nodes they name, oldest first. ``height``:
    theirs (one less than the node's); None in a manifest, which gives each its own."""
    n = r.varint()
    r.varints(n)  # latest generation number below each
    refs = _refs(r, files, n)
    r.varints(n)  # generations below each
    r.take(8 * n)  # earliest commit time below each
    heights = list(r.take(n)) if height is None else [height] * n
    return [
        VersionNodeRef(path, offset, length, h, base)
        for (base, path, offset, length), h in zip(refs, heights, strict=True)
    ]


def _inline_versions(
    manifest: bytes, keys: list[int] | None = None
) -> tuple[_Reader, list[NodeRef | None], list[tuple[str, str]]]:
    """The root node of each version inlined in the manifest, oldest first (None: the empty
    tree), the reader left at the version nodes that follow them, and the data file table;
    ``keys`` gets each version's number of keys."""
    r = _body(manifest, MANIFEST_MAGIC)
    r.take(16)  # uuid
    if r.byte() != 0:
        raise OcdbtFormatError("numbered manifest")  # versions live in manifest.<gen> files
    r.varint()  # max_inline_value_bytes
    r.varint()  # max_decoded_node_bytes
    r.byte()  # version_tree_arity_log2
    if r.varint() == 1:
        r.take(4)  # zstd level (int32le)
    files = _data_files(r, "")
    return r, _leaf_entries(r, files, keys), files


def read_manifest(manifest: bytes) -> tuple[list[NodeRef | None], list[VersionNodeRef], int]:
    """The root nodes of the versions inline in the manifest (the latest ones, oldest first;
    None: the empty tree), the version tree nodes that hold the older ones
    (``decode_version_node``), and the number of keys in the latest version."""
    keys: list[int] = []
    r, roots, files = _inline_versions(manifest, keys)
    return roots, _interior_entries(r, files, None), keys[-1]


def decode_version_node(
    encoded: bytes, ref: VersionNodeRef
) -> tuple[list[VersionNodeRef], list[NodeRef | None]]:
    """One version tree node: the version nodes below it (interior), or the root node of each
    version it holds (leaf; None: the empty tree)."""
    r = _body(encoded, VERSION_MAGIC)
    r.byte()  # version_tree_arity_log2
    height = r.byte()
    if height != ref.height:
        raise OcdbtFormatError("unexpected version node height")
    files = _data_files(r, ref.base)
    if height == 0:
        return [], _leaf_entries(r, files)
    return _interior_entries(r, files, height - 1), []


def read_root(manifest: bytes) -> NodeRef | None:
    """The latest version's root node; None for an empty database."""
    return _inline_versions(manifest)[1][-1]


def _keys(r: _Reader, n: int, interior: bool) -> tuple[list[bytes], list[int]]:
    prefixes = [0, *r.varints(n - 1)]
    suffixes = r.varints(n)
    subtree = r.varints(n) if interior else []
    return _unprefixed(r, prefixes, suffixes), subtree


def _unprefixed(r: _Reader, prefixes: list[int], suffixes: list[int]) -> list[bytes]:
    """Prefix-compressed strings (keys, paths): each is ``prefixes[i]`` bytes of the one
    before, then ``suffixes[i]`` bytes read here."""
    out: list[bytes] = []
    data, pos, prev = r.data, r.pos, b""
    for prefix, suffix in zip(prefixes, suffixes, strict=True):
        if prefix > len(prev):
            raise OcdbtFormatError("prefix longer than the previous string")
        if suffix < 0 or pos + suffix > len(data):
            raise OcdbtFormatError("truncated node")
        prev = prev[:prefix] + data[pos : pos + suffix]
        pos += suffix
        out.append(prev)
    r.pos = pos
    return out


def decode_node(encoded: bytes, ref: NodeRef) -> tuple[list[NodeRef], dict[bytes, Value]]:
    """One b-tree node: its children (interior) or its keys and values (leaf)."""
    r = _body(encoded, BTREE_MAGIC)
    height = r.byte()
    if height != ref.height:
        raise OcdbtFormatError("unexpected node height")
    files = _data_files(r, ref.base)
    n = r.varint()
    if n == 0:
        raise OcdbtFormatError("empty node")
    keys, subtree = _keys(r, n, height > 0)
    if height > 0:
        refs = _refs(r, files, n)
        children = []
        for key, common, (base, path, off, length) in zip(keys, subtree, refs, strict=True):
            children.append(NodeRef(path, off, length, height - 1, base, ref.prefix + key[:common]))
        return children, {}
    lengths = r.varints(n)
    kinds = list(r.take(n))
    if any(k > 1 for k in kinds):
        raise OcdbtFormatError("unknown value kind")
    indirect = [i for i in range(n) if kinds[i] == 1]
    ids = r.varints(len(indirect))
    offsets = r.varints(len(indirect))
    values: dict[bytes, Value] = {}
    for i, file_id, off in zip(indirect, ids, offsets, strict=True):
        if file_id >= len(files):
            raise OcdbtFormatError("data file id out of range")
        base, rel = files[file_id]
        values[ref.prefix + keys[i]] = (base + rel, off, lengths[i])
    for i in range(n):
        if kinds[i] == 0:
            values[ref.prefix + keys[i]] = r.take(lengths[i])
    return [], values


def read_values(
    manifest: bytes, fetch: Fetch, wanted: Callable[[bytes], bool] | None = None
) -> dict[bytes, Value]:
    """Every key of the latest version (those ``wanted`` says yes to), with its value: the
    nodes are fetched a level at a time, each level in one call of ``fetch``."""
    root = read_root(manifest)
    level = [] if root is None else [root]
    out: dict[bytes, Value] = {}
    while level:
        if level[0].height > MAX_HEIGHT:
            raise OcdbtFormatError("tree too deep")
        encoded = fetch([(n.path, n.offset, n.length) for n in level])
        below: list[NodeRef] = []
        for node, data in zip(level, encoded, strict=True):
            if len(data) != node.length:
                raise OcdbtFormatError("node shorter than its reference")
            children, values = decode_node(data, node)
            below += children
            out.update((k, v) for k, v in values.items() if wanted is None or wanted(k))
        level = below
    return out
