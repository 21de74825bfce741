"""What ``ckpt du`` reports: where a checkpoint's bytes are, and which of them are garbage.

Every figure is bytes of files as the store lists them. The totals add up exactly:

- ``total_bytes`` = sum of the steps' ``bytes`` + ``other_bytes`` (files under the path that
  belong to no step: the root's ``metadata/``, unknown files) + the bytes of leftover saves
  (garbage of kind ``tmp-save``, ``unfinished-write``, ``trash``), which are never steps;
- a step's ``bytes`` = its items' ``bytes`` + ``files_bytes`` (its own files:
  ``_CHECKPOINT_METADATA``, ``commit_success.txt``...) + its leftover item saves (``tmp-item``);
- an item's ``bytes`` = its leaves' ``bytes`` + ``metadata_bytes`` + ``garbage_bytes``.

A leaf's ``bytes`` are its stored chunks: in OCDBT, the value lengths of its chunk keys in the
latest version (inline values included; zarr headers are metadata); in plain zarr, every file
of its directory. ``garbage_bytes`` of an OCDBT item are its data files no version of any of
its databases references, plus the bytes of referenced data files that neither the latest
version's b-tree nodes and values nor a version-tree node cover (what older versions left
after a rewrite in place). ``metadata_bytes`` is the rest: manifests, b-tree nodes,
``_METADATA``, ``_sharding``, zarr headers, ckpt's records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict

GarbageKind = Literal[
    "unreferenced-file",
    "unreferenced-ranges",
    "tmp-save",
    "tmp-item",
    "unfinished-write",
    "trash",
    "open-upload",
]
#: Garbage beside the steps, never counted in one (the rest lies inside a step's bytes).
LEFTOVER_KINDS = frozenset({"tmp-save", "unfinished-write", "trash"})
#: Garbage no listing of files shows, outside ``total_bytes``: a bucket's open uploads.
UNLISTED_KINDS = frozenset({"open-upload"})
ItemFormat = Literal["ocdbt", "zarr", "other"]


class LeafUsageJSON(TypedDict):
    name: str
    bytes: int
    logical_bytes: int | None
    dtype: str | None
    shape: list[int] | None
    ratio: float | None


class ItemUsageJSON(TypedDict):
    item: str
    path: str
    format: ItemFormat
    bytes: int
    logical_bytes: int
    leaf_bytes: int
    metadata_bytes: int
    garbage_bytes: int
    exact: bool
    note: str | None
    leaves: list[LeafUsageJSON]


class StepUsageJSON(TypedDict):
    step: int | None
    name: str
    path: str
    status: str
    bytes: int
    logical_bytes: int
    files_bytes: int
    garbage_bytes: int
    items: list[ItemUsageJSON]


class GarbageJSON(TypedDict):
    kind: GarbageKind
    path: str
    bytes: int
    files: int
    step: int | None
    hint: str


class DuplicateJSON(TypedDict):
    item: str
    leaf: str
    digest: str
    steps: list[int | None]
    bytes: int
    saved_bytes: int


class DuJSON(TypedDict):
    """``ckpt du --json``."""

    schema_version: int
    ok: bool
    path: str
    kind: str
    total_bytes: int
    steps_bytes: int
    other_bytes: int
    garbage_bytes: int
    duplicate_bytes: int
    deep: bool
    uncompared_leaves: int
    notes: list[str]
    steps: list[StepUsageJSON]
    garbage: list[GarbageJSON]
    duplicates: list[DuplicateJSON]


def ratio(stored: int, logical: int | None) -> float | None:
    """Stored over logical bytes (below 1: compression saves), rounded; None without a size."""
    return round(stored / logical, 4) if logical else None


@dataclass(frozen=True)
class LeafUsage:
    name: str
    bytes: int
    logical_bytes: int | None  # dtype size x elements; None when the header is unreadable
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    #: Only some chunks stored by design (one host's local tier of Orbax's emergency
    #: checkpointing): ``logical_bytes`` are those of the chunks stored; never read by
    #: ``--deep`` (no whole leaf to compare). Not part of the JSON.
    partial: bool = field(default=False, compare=False)

    def to_json(self) -> LeafUsageJSON:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "logical_bytes": self.logical_bytes,
            "dtype": self.dtype,
            "shape": list(self.shape) if self.shape is not None else None,
            "ratio": ratio(self.bytes, self.logical_bytes),
        }


@dataclass(frozen=True)
class Garbage:
    """Bytes nothing reads, and the command that reclaims them."""

    kind: GarbageKind
    path: str
    bytes: int
    hint: str
    files: int = 1
    step: int | None = None

    def to_json(self) -> GarbageJSON:
        return {
            "kind": self.kind,
            "path": self.path,
            "bytes": self.bytes,
            "files": self.files,
            "step": self.step,
            "hint": self.hint,
        }


@dataclass(frozen=True)
class ItemUsage:
    name: str
    path: str
    format: ItemFormat
    bytes: int
    leaves: tuple[LeafUsage, ...]
    garbage_bytes: int
    #: False when the database could not be walked whole (damage: ``ckpt verify`` says
    #: where) or only conservatively: garbage is then under-, never over-reported.
    exact: bool = True
    note: str | None = None
    #: Leaf -> its digest recorded by ``verify --record`` (with dtype and shape): how
    #: ``duplicates`` finds equal values across steps (with ``--deep``, computed ones too).
    #: Not part of the JSON.
    recorded: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: The item's ``Location``, which ``--deep`` reads. Not part of the JSON.
    location: Any = field(default=None, compare=False, repr=False)

    @property
    def leaf_bytes(self) -> int:
        return sum(leaf.bytes for leaf in self.leaves)

    @property
    def logical_bytes(self) -> int:
        return sum(leaf.logical_bytes or 0 for leaf in self.leaves)

    @property
    def metadata_bytes(self) -> int:
        return self.bytes - self.leaf_bytes - self.garbage_bytes

    def to_json(self) -> ItemUsageJSON:
        return {
            "item": self.name,
            "path": self.path,
            "format": self.format,
            "bytes": self.bytes,
            "logical_bytes": self.logical_bytes,
            "leaf_bytes": self.leaf_bytes,
            "metadata_bytes": self.metadata_bytes,
            "garbage_bytes": self.garbage_bytes,
            "exact": self.exact,
            "note": self.note,
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }


@dataclass(frozen=True)
class StepUsage:
    step: int | None  # None: a save without a step number, or an item given alone
    name: str
    path: str
    status: str
    bytes: int
    items: tuple[ItemUsage, ...]
    files_bytes: int  # the step's own files, outside its items
    leftover_bytes: int = 0  # item saves left unfinished inside the step (also in garbage)

    @property
    def garbage_bytes(self) -> int:
        return self.leftover_bytes + sum(i.garbage_bytes for i in self.items)

    @property
    def logical_bytes(self) -> int:
        return sum(i.logical_bytes for i in self.items)

    def to_json(self) -> StepUsageJSON:
        return {
            "step": self.step,
            "name": self.name,
            "path": self.path,
            "status": self.status,
            "bytes": self.bytes,
            "logical_bytes": self.logical_bytes,
            "files_bytes": self.files_bytes,
            "garbage_bytes": self.garbage_bytes,
            "items": [i.to_json() for i in self.items],
        }


@dataclass(frozen=True)
class Duplicate:
    """One leaf whose values are the same in several steps (equal recorded digests)."""

    item: str
    leaf: str
    digest: str  # ``ld1:...`` or ``sha256:...``, as recorded by ``verify --record``
    steps: tuple[int | None, ...]
    bytes: int  # stored bytes of all its copies
    #: What a store keeping one copy would save: all copies but the largest.
    saved_bytes: int

    def to_json(self) -> DuplicateJSON:
        return {
            "item": self.item,
            "leaf": self.leaf,
            "digest": self.digest,
            "steps": list(self.steps),
            "bytes": self.bytes,
            "saved_bytes": self.saved_bytes,
        }


@dataclass(frozen=True)
class DuReport:
    """``ckpt du``: a root, a step or an item, every byte accounted for."""

    #: 2: ``deep``, ``uncompared_leaves``, ``notes``; garbage of kind ``open-upload`` (outside
    #: ``total_bytes``: no listing of files shows it).
    SCHEMA_VERSION: ClassVar[int] = 2

    path: str
    kind: str  # root | step | item
    total_bytes: int
    steps: tuple[StepUsage, ...]
    other_bytes: int
    garbage: tuple[Garbage, ...]
    duplicates: tuple[Duplicate, ...] = ()
    #: Whether digests no record holds were computed from the values (``--deep``).
    deep: bool = False
    #: Leaves found in several steps (same item, name, dtype and shape) whose values were not
    #: compared: no digest recorded, none computed (no ``--deep``, or unreadable).
    uncompared_leaves: int = 0
    #: What ``du`` could not look at (a bucket's open uploads it may not list).
    notes: tuple[str, ...] = ()

    @property
    def duplicate_bytes(self) -> int:
        return sum(d.saved_bytes for d in self.duplicates)

    @property
    def steps_bytes(self) -> int:
        return sum(s.bytes for s in self.steps)

    @property
    def garbage_bytes(self) -> int:
        return sum(g.bytes for g in self.garbage)

    def to_json(self) -> DuJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "path": self.path,
            "kind": self.kind,
            "total_bytes": self.total_bytes,
            "steps_bytes": self.steps_bytes,
            "other_bytes": self.other_bytes,
            "garbage_bytes": self.garbage_bytes,
            "duplicate_bytes": self.duplicate_bytes,
            "deep": self.deep,
            "uncompared_leaves": self.uncompared_leaves,
            "notes": list(self.notes),
            "steps": [s.to_json() for s in self.steps],
            "garbage": [g.to_json() for g in self.garbage],
            "duplicates": [d.to_json() for d in self.duplicates],
        }
