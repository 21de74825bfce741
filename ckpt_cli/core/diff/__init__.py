"""``diff``: compare two items leaf by leaf, values streamed block by block.

Leaves only in A, only in B, dtype or shape changed, and for arrays present in both with the same
shape: equal, or how far apart (max absolute and relative difference, elements outside
``|a - b| <= atol + rtol * |b|``, numpy's ``allclose`` rule). NaN equals NaN at the same place
(a faithful copy of a diverged step is equal to it), and never silently: each leaf whose values
were read counts the NaN and Inf of each side (``NonFiniteCounts``) and its note says where they
are (``both NaN at the same 32 places``, ``32 NaN in B``). A NaN against a number makes the
largest difference NaN, an Inf against anything else Inf: ``max_abs`` and ``max_rel`` are then
that float, written ``null`` in JSON with ``max_abs_diff_nonfinite`` saying which
(``core.schema.finite``); a leaf NaN on both sides everywhere has no difference to measure
(``max_abs`` None).
A dtype change counts as different unless ``compare_cast``: then both sides are compared as
float64 (exact for every dtype up to 32 bits; int64 beyond 2**53 rounds), complex ones as
complex128 (both parts count; the distance is ``|a - b|``). Blocks follow A's
chunking (merged with B's when the common multiple is small), reads of A and B in flight
together.

Memory is bounded by ``memory_limit`` whatever the leaf size: blocks get a 64th of it (at most
16 MiB; the comparison's float64 temporaries are a few times a block), and a chunk larger than
a block is read in slabs through a chunk cache that holds it (``format.blocks.stream_blocks``):
decoded once per side, compared slab by slab, so progress moves from the first slab. A single
chunk larger than the limit is the format's floor: it is decoded whole, and the leaf says so.
``structure_only`` compares names, kinds, dtypes, shapes and layouts and reads no array data: a
leaf whose device mesh, partition spec or chunk grid differs is ``sharding_changed``, its message
saying what changed (``mesh data=4,model=2 -> data=2,model=4; chunks 4x2 of [2,2] -> 2x4 of
[4,1]``). A value diff does not look at layouts: a resharded leaf of equal values is ``equal``.

This module holds what diff reports (``DiffReport``, ``LeafDiff``, their JSON documents);
``items.py`` resolves the two sides and pairs their items and leaves (``diff_paths``,
``diff_items``), ``values.py`` compares two leaves: structure and layout, then values streamed
block by block, each pair of blocks compared by ``compare.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, TypedDict

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.sharding import Shape
from ckpt_cli.core.schema.finite import NonFinite, finite_or_none, nonfinite_kind

DIFF_BLOCK_BYTES = 16 << 20
MEMORY_LIMIT = 1 << 30
#: Block pairs and bytes a side (at most a 16th of the memory limit) read ahead, across leaves:
#: many small leaves keep as many requests in flight as one large one.
DIFF_IN_FLIGHT = 16
DIFF_IN_FLIGHT_BYTES = 64 << 20

Status = str
STATUSES: tuple[Status, ...] = (
    "equal",
    "different",
    "only_a",
    "only_b",
    "dtype_changed",
    "shape_changed",
    "kind_changed",
    "sharding_changed",
    "error",
)


class SideJSON(TypedDict):
    path: str
    step: int | None
    item: str


class DiffSideJSON(SideJSON):
    """A side of a diff: where, and its format (``orbax``, or ``safetensors``: then ``item``
    names the file, or the index's shards, and ``step`` is null)."""

    format: str


class ToleranceJSON(TypedDict):
    atol: float
    rtol: float


class SideNonFiniteJSON(TypedDict):
    nan: int
    inf: int  # +Inf and -Inf


class LeafNonFiniteJSON(TypedDict):
    """The NaN and Inf values of each side of a leaf whose values were read (v5), and how many
    places are NaN on both (equal there)."""

    a: SideNonFiniteJSON
    b: SideNonFiniteJSON
    both_nan: int


class LeafDiffJSON(TypedDict):
    name: str
    status: str
    dtype: list[str | None]
    shape: list[Shape | None]
    elements: int
    mismatched: int
    #: null when no values were compared, or when it is NaN/Inf: then the ``_nonfinite`` key
    #: beside it says which (v5; a NaN against a number makes it ``"nan"``)
    max_abs_diff: float | None
    max_abs_diff_nonfinite: NonFinite | None
    max_rel_diff: float | None
    max_rel_diff_nonfinite: NonFinite | None
    #: v5: null when the values were not read (structure, a dtype change, not an array)
    nonfinite: LeafNonFiniteJSON | None
    message: str | None


class ItemDiffJSON(TypedDict):
    """One pair of items of the same name compared (v3)."""

    item: str
    a: DiffSideJSON
    b: DiffSideJSON
    equal: bool
    summary: dict[str, int]
    leaves: list[LeafDiffJSON]


class DiffJSON(TypedDict):
    """``ckpt diff --json``: leaf by leaf; ``ok`` is ``equal``. Two steps of several items
    are compared item by item of the same name: ``leaves`` and ``summary`` of them all,
    each pair in ``items``, the items only one side holds in ``items_only_a``/``_b``."""

    schema_version: int
    ok: bool
    a: DiffSideJSON
    b: DiffSideJSON
    equal: bool
    tolerance: ToleranceJSON
    compare_cast: bool
    #: ``--spec``: the migrate spec applied to A's names and values before comparing.
    spec: str | None
    #: ``--ignore`` patterns, and how many names they left out (both sides counted).
    ignore: list[str]
    ignored: int
    #: ``--structure``: names, kinds, dtypes, shapes, shardings compared; no array data read.
    structure_only: bool
    summary: dict[str, int]
    leaves: list[LeafDiffJSON]
    items: list[ItemDiffJSON]
    items_only_a: list[str]
    items_only_b: list[str]


@dataclass(frozen=True)
class NonFiniteCounts:
    """NaN and Inf (either sign) values of side A and side B of a leaf, and the places NaN on
    both."""

    nan_a: int = 0
    inf_a: int = 0
    nan_b: int = 0
    inf_b: int = 0
    both_nan: int = 0

    def side(self, i: int) -> int:
        """Non-finite values of side A (0) or B (1)."""
        return (self.nan_a + self.inf_a, self.nan_b + self.inf_b)[i]

    @property
    def any(self) -> bool:
        return bool(self.side(0) or self.side(1))

    def phrase(self) -> str | None:
        """Where they are, in words (``both NaN at the same 32 places``, ``32 NaN in B``);
        None when both sides are finite."""
        if not self.any:
            return None
        parts = []
        if self.nan_a == self.nan_b == self.both_nan > 0:
            parts.append(f"both NaN at the same {_places(self.both_nan)}")
        else:
            parts += [f"{n} NaN in {s}" for n, s in ((self.nan_a, "A"), (self.nan_b, "B")) if n]
            if self.both_nan:
                parts.append(f"{self.both_nan} of them at the same places")
        parts += [f"{n} Inf in {s}" for n, s in ((self.inf_a, "A"), (self.inf_b, "B")) if n]
        return ", ".join(parts)

    def to_json(self) -> LeafNonFiniteJSON:
        return {
            "a": {"nan": self.nan_a, "inf": self.inf_a},
            "b": {"nan": self.nan_b, "inf": self.inf_b},
            "both_nan": self.both_nan,
        }


def _places(n: int) -> str:
    return "place" if n == 1 else f"{n} places"


@dataclass(frozen=True)
class LeafDiff:
    name: str
    status: Status
    dtype_a: str | None = None
    dtype_b: str | None = None
    shape_a: tuple[int, ...] | None = None
    shape_b: tuple[int, ...] | None = None
    elements: int = 0
    mismatched: int = 0  # elements outside the tolerance (NaN against a number included)
    #: NaN (a NaN against a number) or Inf (an Inf against anything else) where it is one.
    max_abs: float | None = None
    max_rel: float | None = None
    message: str | None = None
    #: NaN and Inf of each side; None when the values were not read.
    nonfinite: NonFiniteCounts | None = None

    @property
    def equal(self) -> bool:
        return self.status == "equal"

    @property
    def has_nonfinite(self) -> bool:
        """A side holds NaN or Inf: worth showing, equal or not."""
        return self.nonfinite is not None and self.nonfinite.any

    def to_json(self) -> LeafDiffJSON:
        return {
            "name": self.name,
            "status": self.status,
            "dtype": [self.dtype_a, self.dtype_b],
            "shape": [
                None if self.shape_a is None else list(self.shape_a),
                None if self.shape_b is None else list(self.shape_b),
            ],
            "elements": self.elements,
            "mismatched": self.mismatched,
            "max_abs_diff": finite_or_none(self.max_abs),
            "max_abs_diff_nonfinite": nonfinite_kind(self.max_abs),
            "max_rel_diff": finite_or_none(self.max_rel),
            "max_rel_diff_nonfinite": nonfinite_kind(self.max_rel),
            "nonfinite": None if self.nonfinite is None else self.nonfinite.to_json(),
            "message": self.message,
        }


@dataclass(frozen=True)
class DiffReport:
    a: ItemRef
    b: ItemRef
    atol: float
    rtol: float
    compare_cast: bool
    leaves: tuple[LeafDiff, ...]
    structure_only: bool = False
    #: The other pairs of items of the same name (two steps of several items, no --item).
    more: tuple[DiffReport, ...] = ()
    items_only_a: tuple[str, ...] = ()
    items_only_b: tuple[str, ...] = ()
    #: Each side's format: ``orbax`` or ``safetensors``.
    formats: tuple[str, str] = ("orbax", "orbax")
    spec: str | None = None
    ignore: tuple[str, ...] = ()
    ignored: int = 0
    #: 2: structure_only (--structure). 3: items, items_only_a, items_only_b. 4: each side's
    #: format; spec, ignore, ignored (safetensors sides, --spec, --ignore). 5: each leaf's
    #: ``nonfinite`` counts, ``max_abs_diff_nonfinite`` and ``max_rel_diff_nonfinite`` (a NaN
    #: or Inf difference is null beside them, no longer a bare ``Infinity``).
    SCHEMA_VERSION: ClassVar[int] = 5

    @property
    def pairs(self) -> tuple[DiffReport, ...]:
        """Every pair of items compared, this one first, each with only its own leaves."""
        return (replace(self, more=(), items_only_a=(), items_only_b=()), *self.more)

    @property
    def all_leaves(self) -> tuple[LeafDiff, ...]:
        return tuple(d for pair in self.pairs for d in pair.leaves)

    @property
    def equal(self) -> bool:
        one_sided = self.items_only_a or self.items_only_b
        return not one_sided and all(d.equal for d in self.all_leaves)

    def count(self, status: Status) -> int:
        return sum(1 for d in self.all_leaves if d.status == status)

    def to_json(self) -> DiffJSON:
        """The document ``ckpt diff --json`` prints."""
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": self.equal,
            "a": self.side(0),
            "b": self.side(1),
            "equal": self.equal,
            "tolerance": {"atol": self.atol, "rtol": self.rtol},
            "compare_cast": self.compare_cast,
            "spec": self.spec,
            "ignore": list(self.ignore),
            "ignored": self.ignored,
            "structure_only": self.structure_only,
            "summary": {s: self.count(s) for s in STATUSES},
            "leaves": [d.to_json() for d in self.all_leaves],
            "items": [pair.item_json() for pair in self.pairs],
            "items_only_a": list(self.items_only_a),
            "items_only_b": list(self.items_only_b),
        }

    def item_json(self) -> ItemDiffJSON:
        """This pair of items alone (its ``more`` aside)."""
        return {
            "item": self.a.name,
            "a": self.side(0),
            "b": self.side(1),
            "equal": all(d.equal for d in self.leaves),
            "summary": {s: sum(d.status == s for d in self.leaves) for s in STATUSES},
            "leaves": [d.to_json() for d in self.leaves],
        }

    def side(self, i: int) -> DiffSideJSON:
        """Side A (0) or B (1) with its format."""
        return {**side_json((self.a, self.b)[i]), "format": self.formats[i]}


def side_json(ref: ItemRef) -> SideJSON:
    """One side of a comparison (and migrate's source): where the item is."""
    return {"path": str(ref.location), "step": ref.step, "item": ref.name}
