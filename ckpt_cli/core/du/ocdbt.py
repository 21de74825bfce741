"""Attribute an OCDBT item's bytes to its leaves, and find the bytes no version reads.

Two walks of each database of the item (the merged root and every ``ocdbt.process_N``):

- the latest version, decoded here (``format/ocdbt.py``, a level of b-tree nodes per batched
  read): every key's value (inline bytes, or a data file range), which the leaves are made of;
- every version, through TensorStore (``verify/ocdbt.scan_database``): which data files any
  version references, and every version's b-tree and version-tree nodes.

A data file below ``d/`` that no version of any database references is garbage. So are the
bytes of a referenced data file that no value of the latest version and no node of any
version covers: the values only older versions read (a rewrite in place leaves them). The
latest version is the merged root's where there is one (what Orbax and TensorStore open; the
per-process databases are where its data files live), else each ``ocdbt.process_N``'s. The
b-tree nodes of older versions are metadata, not garbage: every Orbax save commits several
versions (one per batch of writes), each with its own root node. When a walk cannot finish
(damage), no garbage is reported for the item: never a false alarm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckpt_cli.core.format.names import MANIFEST
from ckpt_cli.core.format.ocdbt import OcdbtFormatError, Value, read_values
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError

_PROCESS_MANIFEST = re.compile(r"(ocdbt\.process_\d+)/" + re.escape(MANIFEST))
_DATA_FILE = re.compile(r"(?:ocdbt\.process_\d+/)?d/[^/]+")
#: (item-relative file, offset, length)
Range = tuple[str, int, int]


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
    names = set(files)
    out = [""] if MANIFEST in names else []
    out += sorted(m.group(1) for n in names if (m := _PROCESS_MANIFEST.fullmatch(n)))
    return out


def is_ocdbt(files: Iterable[str]) -> bool:
    return bool(databases(files))


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


def walk_item(item: Location, files: dict[str, int]) -> ItemDatabases:
    """Walk every database of ``item`` (``files``: its files, item-relative, with sizes)."""
    from ckpt_cli.core.verify.ocdbt import scan_database

    out = ItemDatabases()
    dbs = databases(files)
    referenced: set[str] = set()
    live: dict[str, list[tuple[int, int]]] = {}
    scans_complete = True
    for db in dbs:
        scan = scan_database(item, db, files.get)
        scans_complete &= scan.complete and not scan.problems
        for ref, _ in scan.refs:
            referenced.add(ref.file)
            if ref.kind != "value":  # nodes of every version: metadata
                live.setdefault(ref.file, []).append((ref.offset, ref.end))
        if db and "" in dbs:
            continue  # readers open the merged root: its values are the live ones
        try:
            values = _latest(item, db)
        except (OcdbtFormatError, CkptError, ValueError):
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
    # A directory of data files without its manifest, or a value past the end of its file
    # (or in a missing one): a damaged item, whose unreferenced bytes are no garbage to delete.
    holders = {name.rpartition("d/")[0].rstrip("/") for name in files if _DATA_FILE.fullmatch(name)}
    scans_complete &= holders <= set(dbs)
    scans_complete &= all(
        files.get(file, -1) >= max(end for _, end in spans) for file, spans in live.items()
    )
    if not scans_complete:
        out.exact = False
        out.note = "the OCDBT database is damaged (`ckpt verify` says where): no garbage reported"
        return out
    for name, size in sorted(files.items()):
        if not _DATA_FILE.fullmatch(name):
            continue
        if name not in referenced:
            out.unreferenced.append(name)
        elif (unused := size - _covered(live.get(name, []))) > 0:
            out.unused[name] = unused
    if not out.exact:
        out.note = "OCDBT manifest read through TensorStore: inline chunks count 0 bytes"
    return out
