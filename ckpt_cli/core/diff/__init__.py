"""``diff``: compare two items leaf by leaf, values streamed block by block.

Leaves only in A, only in B, dtype or shape changed, and for arrays present in both with the same
shape: equal, or how far apart (max absolute and relative difference, elements outside
``|a - b| <= atol + rtol * |b|``, numpy's ``allclose`` rule). NaN equals NaN at the same place.
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
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypedDict

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader, cached_context
from ckpt_cli.core.format.blocks import (
    block_shape,
    cache_bytes,
    decoded_chunk_bytes,
    is_large,
    iter_blocks,
    stream_blocks,
)
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.resolve import resolve_item, resolve_trees
from ckpt_cli.core.format.scan import (
    OPEN_CACHE_BYTES,
    ScanTask,
    open_readers,
    read_block,
    streamed_slabs,
)
from ckpt_cli.core.format.sharding import Shape
from ckpt_cli.core.inspect import ItemReport, Leaf, inspect_item
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.units import human_bytes
from ckpt_cli.errors import CkptError, NotFoundError, UsageError, first_line

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


class ToleranceJSON(TypedDict):
    atol: float
    rtol: float


class LeafDiffJSON(TypedDict):
    name: str
    status: str
    dtype: list[str | None]
    shape: list[Shape | None]
    elements: int
    mismatched: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    message: str | None


class ItemDiffJSON(TypedDict):
    """One pair of items of the same name compared (v3)."""

    item: str
    a: SideJSON
    b: SideJSON
    equal: bool
    summary: dict[str, int]
    leaves: list[LeafDiffJSON]


class DiffJSON(TypedDict):
    """``ckpt diff --json``: leaf by leaf; ``ok`` is ``equal``. Two steps of several items
    are compared item by item of the same name: ``leaves`` and ``summary`` of them all,
    each pair in ``items``, the items only one side holds in ``items_only_a``/``_b``."""

    schema_version: int
    ok: bool
    a: SideJSON
    b: SideJSON
    equal: bool
    tolerance: ToleranceJSON
    compare_cast: bool
    #: ``--structure``: names, kinds, dtypes, shapes, shardings compared; no array data read.
    structure_only: bool
    summary: dict[str, int]
    leaves: list[LeafDiffJSON]
    items: list[ItemDiffJSON]
    items_only_a: list[str]
    items_only_b: list[str]


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
    max_abs: float | None = None
    max_rel: float | None = None
    message: str | None = None

    @property
    def equal(self) -> bool:
        return self.status == "equal"

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
            "max_abs_diff": self.max_abs,
            "max_rel_diff": self.max_rel,
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
    #: 2: structure_only (--structure). 3: items, items_only_a, items_only_b.
    SCHEMA_VERSION: ClassVar[int] = 3

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
            "a": side_json(self.a),
            "b": side_json(self.b),
            "equal": self.equal,
            "tolerance": {"atol": self.atol, "rtol": self.rtol},
            "compare_cast": self.compare_cast,
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
            "a": side_json(self.a),
            "b": side_json(self.b),
            "equal": all(d.equal for d in self.leaves),
            "summary": {s: sum(d.status == s for d in self.leaves) for s in STATUSES},
            "leaves": [d.to_json() for d in self.leaves],
        }


def side_json(ref: ItemRef) -> SideJSON:
    """One side of a comparison (and migrate's source): where the item is."""
    return {"path": str(ref.location), "step": ref.step, "item": ref.name}


def diff_paths(
    a: str,
    b: str,
    *,
    step: int | None = None,
    step_a: int | None = None,
    step_b: int | None = None,
    item: str | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    compare_cast: bool = False,
    name_filter: str | None = None,
    on_progress: ProgressFn | None = None,
    storage: StorageOptions | None = None,
    item_a: str | None = None,
    item_b: str | None = None,
    memory_limit: int = MEMORY_LIMIT,
    structure_only: bool = False,
) -> DiffReport:
    """``ckpt diff A B``: resolve both sides (``step`` for both roots unless ``step_a`` or
    ``step_b``; ``item`` for both unless ``item_a`` or ``item_b``), then compare them."""
    _check_tolerance(atol, rtol)
    step_a = step_a if step_a is not None else step
    step_b = step_b if step_b is not None else step
    several = item is None and item_a is None and item_b is None
    side = resolve_side_items if several else resolve_side
    refs_a = side(a, step_a, item_a or item, "--step-a", storage)
    refs_b = side(b, step_b, item_b or item, "--step-b", storage)
    pairs, only_a, only_b = pair_items(
        refs_a if isinstance(refs_a, list) else [refs_a],
        refs_b if isinstance(refs_b, list) else [refs_b],
    )
    reports = [
        diff_items(
            ref_a,
            ref_b,
            atol,
            rtol,
            compare_cast,
            name_filter,
            on_progress,
            memory_limit=memory_limit,
            structure_only=structure_only,
        )
        for ref_a, ref_b in pairs
    ]
    return replace(reports[0], more=tuple(reports[1:]), items_only_a=only_a, items_only_b=only_b)


def pair_items(
    a: list[ItemRef], b: list[ItemRef]
) -> tuple[list[tuple[ItemRef, ItemRef]], tuple[str, ...], tuple[str, ...]]:
    """The items of two steps to compare: one with one (whatever their names), else those of
    the same name (A's order), and the names only A, only B holds."""
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])], (), ()
    names_b = {r.name: r for r in b}
    pairs = [(r, names_b[r.name]) for r in a if r.name in names_b]
    if not pairs:
        raise UsageError(
            f"A and B hold no item of the same name (A: {', '.join(r.name for r in a)}; "
            f"B: {', '.join(r.name for r in b)})",
            hint="choose one on each side with --item-a NAME --item-b NAME",
        )
    only_a = tuple(r.name for r in a if r.name not in names_b)
    names_a = {r.name for r in a}
    return pairs, only_a, tuple(r.name for r in b if r.name not in names_a)


def _check_tolerance(atol: float, rtol: float) -> None:
    if atol < 0 or rtol < 0:
        raise UsageError("--atol and --rtol must not be negative")


def resolve_side(
    target: str,
    step: int | None = None,
    item: str | None = None,
    flag: str = "--step",
    storage: StorageOptions | None = None,
) -> ItemRef:
    """One side of a diff: a root, step or item path, where ``ROOT@STEP`` picks a step and
    ``ROOT@STEP:ITEM`` an item of it (unless a file or directory of that very name exists)."""
    location, step, item = _side(target, step, item, flag, storage)
    return resolve_item(location, step, item)


def resolve_side_items(
    target: str,
    step: int | None = None,
    item: str | None = None,
    flag: str = "--step",
    storage: StorageOptions | None = None,
) -> list[ItemRef]:
    """``resolve_side``, except that a step of several PyTree items (and no item named)
    resolves to every one of them (``resolve_trees``)."""
    location, step, item = _side(target, step, item, flag, storage)
    return resolve_trees(location, step, item)


def _side(
    target: str, step: int | None, item: str | None, flag: str, storage: StorageOptions | None
) -> tuple[Location, int | None, str | None]:
    """Where a side's item is looked for: its location, step and item, ``@STEP:ITEM`` read."""
    path, at, tail = target.rpartition("@")
    if at and not os.path.exists(target):
        number, colon, name = tail.partition(":")
        if number.isdigit() and (not colon or name):
            if step is not None:
                raise UsageError(f"{target} names a step; do not also pass {flag} or --step")
            if colon and item is not None and item != name:
                raise UsageError(f"{target} names the item {name!r}; --item says {item!r}")
            return open_location(path, storage), int(number), name or item
    return open_location(target, storage), step, item


def diff_items(
    a: ItemRef,
    b: ItemRef,
    atol: float = 0.0,
    rtol: float = 0.0,
    compare_cast: bool = False,
    name_filter: str | None = None,
    on_progress: ProgressFn | None = None,
    *,
    memory_limit: int = MEMORY_LIMIT,
    structure_only: bool = False,
) -> DiffReport:
    """Compare ``a`` with ``b`` leaf by leaf (progress as ``data`` bytes of the arrays in both),
    holding about ``memory_limit`` bytes at most; ``structure_only``: no array data read."""
    _check_tolerance(atol, rtol)
    ra, rb = inspect_item(a, name_filter), inspect_item(b, name_filter)
    if "unknown" in (ra.kind, rb.kind):
        files = () if structure_only else _diff_files(a, b, name_filter)
        return DiffReport(a, b, atol, rtol, compare_cast, files, structure_only)
    leaves = _diff_leaves(
        ra, rb, atol, rtol, compare_cast, on_progress, memory_limit, structure_only
    )
    return DiffReport(a, b, atol, rtol, compare_cast, leaves, structure_only)


def _diff_leaves(
    ra: ItemReport,
    rb: ItemReport,
    atol: float,
    rtol: float,
    compare_cast: bool,
    on_progress: ProgressFn | None,
    memory_limit: int,
    structure_only: bool,
) -> tuple[LeafDiff, ...]:
    """``diff_items`` of two items ckpt reads, leaf by leaf."""
    la = {leaf.name: leaf for leaf in ra.leaves}
    lb = {leaf.name: leaf for leaf in rb.leaves}
    common = [(la[n], lb[n]) for n in sorted(la.keys() & lb.keys())]
    budget = max(1 << 20, min(DIFF_BLOCK_BYTES, memory_limit // 64))
    # Each side's chunk cache holds its largest chunk that does not fit a block (twice: the
    # next one's reads start while the last slabs of one are compared).
    cache_a = cache_bytes((x.array for x, _ in common if x.array), budget)
    cache_b = cache_bytes((y.array for _, y in common if y.array), budget)
    if structure_only:
        sa = sb = None
    else:
        sa, sb = _store(ra, cache_a), _store(rb, cache_b)
    total = 0 if structure_only else sum(x.size_bytes for x, y in common if x.is_array)
    on_bytes = ByteProgress(on_progress, "data", total)

    out: list[LeafDiff | None] = []
    jobs: list[_Job] = []
    for name in sorted(la.keys() | lb.keys()):
        x, y = la.get(name), lb.get(name)
        if x is None or y is None:
            out.append(_one_sided(name, x, y))
            continue
        if structure_only:
            out.append(_diff_structure(x, y))
            continue
        decided = _decided(x, y, compare_cast)
        if decided is None:
            jobs.append(_Job(len(out), x, y, Compare(atol, rtol, exact_ints=x.dtype == y.dtype)))
        out.append(decided)
    if jobs:
        assert sa is not None and sb is not None
        held = max(budget, min(DIFF_IN_FLIGHT_BYTES, memory_limit // 16))
        _stream(sa, sb, jobs, on_bytes, budget, held, (cache_a, cache_b))
    for job in jobs:
        out[job.index] = _compared(job)
    both = {} if structure_only else {x.name: x for x, _ in common}
    streamed = {job.x.name for job in jobs if job.streamed}
    return tuple(
        d if d.name in streamed else _floor_note(d, both.get(d.name), memory_limit)
        for d in out
        if d is not None
    )


def _diff_files(a: ItemRef, b: ItemRef, name_filter: str | None) -> tuple[LeafDiff, ...]:
    """Two items of a handler ckpt does not read, file by file, byte for byte (its commit
    marker aside, which names the path it was written to)."""
    from ckpt_cli.core.format.items import BOOKKEEPING
    from ckpt_cli.core.format.names import compile_filter

    pattern = compile_filter(name_filter)

    def files(ref: ItemRef) -> dict[str, int]:
        try:
            walked = ref.location.walk()
        except NotFoundError:
            return {}
        return {
            rel: e.size
            for rel, e in walked
            if not e.is_symlink and rel not in BOOKKEEPING and (not pattern or pattern.search(rel))
        }

    fa, fb = files(a), files(b)
    out = []
    for rel in sorted(fa.keys() | fb.keys()):
        if rel not in fb or rel not in fa:
            out.append(LeafDiff(rel, "only_a" if rel not in fb else "only_b"))
            continue
        same = fa[rel] == fb[rel] and (
            a.location.child(*rel.split("/")).read_bytes()
            == b.location.child(*rel.split("/")).read_bytes()
        )
        message = None if same else f"the file's bytes differ ({fa[rel]} vs {fb[rel]} bytes)"
        out.append(LeafDiff(rel, "equal" if same else "different", message=message))
    return tuple(out)


def _one_sided(name: str, x: Leaf | None, y: Leaf | None) -> LeafDiff:
    """A leaf only one side has."""
    leaf = x or y
    assert leaf is not None
    return LeafDiff(
        name,
        "only_a" if y is None else "only_b",
        *((leaf.dtype, None) if y is None else (None, leaf.dtype)),
        *((leaf.shape, None) if y is None else (None, leaf.shape)),
    )


def _floor_note(d: LeafDiff, x: Leaf | None, memory_limit: int) -> LeafDiff:
    """``d``, saying so when one chunk of the leaf, decoded on both sides, exceeds the limit."""
    if x is None or x.array is None or 2 * decoded_chunk_bytes(x.array) <= memory_limit // 2:
        return d
    note = (
        f"a chunk is {human_bytes(decoded_chunk_bytes(x.array))} decoded, held whole "
        "on each side: the format's floor, above what --memory-limit leaves for it"
    )
    return replace(d, message=f"{d.message}; {note}" if d.message else note)


def _store(report: ItemReport, cache: int = 0) -> ItemStore | None:
    if report.storage == "json":
        return None
    # One context for every leaf: its cache keeps the OCDBT manifest and tree nodes, which a
    # context per open would read again for each of thousands of small leaves; and it holds a
    # chunk larger than a block while that chunk is read in slabs.
    context = cached_context(max(cache, OPEN_CACHE_BYTES))
    return ItemStore(report.ref.location, report.zarr_format == 3, context)


def _diff_structure(x: Leaf, y: Leaf) -> LeafDiff:
    """What the metadata alone says: kind, dtype, shape and sharding (no array data read)."""
    if x.problem or y.problem:
        return _result(x, y, "error", message=x.problem or y.problem)
    if x.is_array != y.is_array or (x.value_type != y.value_type and not x.is_array):
        return _result(x, y, "kind_changed", message=f"{x.value_type} vs {y.value_type}")
    if x.shape != y.shape:
        return _result(x, y, "shape_changed")
    if x.dtype != y.dtype:
        return _result(x, y, "dtype_changed")
    changes = sharding_changes(x, y)
    if changes:
        return _result(x, y, "sharding_changed", message="; ".join(changes))
    if not x.is_array and x.value != y.value:
        return _result(x, y, "different", message=_both_values(x, y))
    return _result(x, y, "equal", elements=x.elements)


def sharding_changes(x: Leaf, y: Leaf) -> list[str]:
    """How the layout of a leaf differs from A to B, one phrase per aspect: the device mesh
    (axis names and sizes), the partition spec (or the device of a single-device leaf), the
    chunk grid (chunks per dimension, and the chunk shape). Empty when laid out alike."""
    sx, sy = x.sharding, y.sharding
    out = []
    mesh_a, mesh_b = (s.mesh_str() if s else None for s in (sx, sy))
    if mesh_a != mesh_b:
        out.append(f"mesh {mesh_a or 'none'} -> {mesh_b or 'none'}")
    spec_a, spec_b = (s.short() if s else None for s in (sx, sy))
    if spec_a != spec_b:
        # A single-device leaf has no spec: its device is what changed.
        label = "spec" if mesh_a and mesh_b else "sharding"
        out.append(f"{label} {spec_a or 'none'} -> {spec_b or 'none'}")
    # A reshard for another mesh rechunks even where mesh and spec print alike (a replicated
    # leaf): the chunk grid is what readers of each device see.
    ca, cb = x.chunk_shape, y.chunk_shape
    if ca is not None and cb is not None and ca != cb and x.shape is not None:
        out.append(f"chunks {_grid(x.shape, ca)} -> {_grid(x.shape, cb)}")
    return out


def _grid(shape: tuple[int, ...], chunk: tuple[int, ...]) -> str:
    """``4x2 of [2,2]``: chunks per dimension, then the chunk shape."""
    grid = "x".join(str(-(-s // c) if c else 0) for s, c in zip(shape, chunk, strict=False))
    return f"{grid or '1'} of [{','.join(map(str, chunk))}]"


def _both_values(x: Leaf, y: Leaf) -> str:
    """The two sides of a differing JSON leaf (their JSON text), so a metric's change reads
    at a glance."""
    return f"{x.value} vs {y.value}"


def _result(x: Leaf, y: Leaf, status: Status, **extra: Any) -> LeafDiff:
    return LeafDiff(x.name, status, x.dtype, y.dtype, x.shape, y.shape, **extra)


def _decided(x: Leaf, y: Leaf, compare_cast: bool) -> LeafDiff | None:
    """The result of a pair whose values need not be read; None when they must be compared."""
    if x.problem or y.problem:
        return _result(x, y, "error", message=x.problem or y.problem)
    if x.is_array != y.is_array or (not x.is_array and x.value_type != y.value_type):
        return _result(x, y, "kind_changed", message=f"{x.value_type} vs {y.value_type}")
    if not x.is_array:
        if x.value == y.value:
            return _result(x, y, "equal")
        return _result(x, y, "different", message=_both_values(x, y))
    if x.shape != y.shape:
        return _result(x, y, "shape_changed")
    if x.dtype != y.dtype and not compare_cast:
        return _result(
            x,
            y,
            "dtype_changed",
            message="values not compared (pass --compare-cast to compare them as float64)",
        )
    return None


@dataclass
class _Job:
    """A pair of arrays whose values are compared: where its result goes, and how far it got."""

    index: int
    x: Leaf
    y: Leaf
    acc: Compare
    error: str | None = None
    streamed: bool = False  # compared slab by slab from streamed chunks (no whole decode)


def _compared(job: _Job) -> LeafDiff:
    x, y, acc = job.x, job.y, job.acc
    assert x.array is not None
    if job.error is not None:
        return _result(x, y, "error", message=job.error)
    status = "equal" if acc.mismatched == 0 else "different"
    note = f"compared as float64 ({x.dtype} vs {y.dtype})" if x.dtype != y.dtype else None
    return _result(
        x,
        y,
        status,
        elements=x.array.size,
        mismatched=acc.mismatched,
        max_abs=acc.max_abs,
        max_rel=acc.max_rel,
        message=note,
    )


def _stream(
    sa: ItemStore,
    sb: ItemStore,
    jobs: list[_Job],
    on_bytes: Callable[[int], None],
    budget: int = DIFF_BLOCK_BYTES,
    held_bytes: int = DIFF_IN_FLIGHT_BYTES,
    caches: tuple[int, int] = (0, 0),
) -> None:
    """Every pair's blocks in one pipeline: leaves opened ahead on both sides (one TensorStore
    context each, so an OCDBT tree is read once; its chunk cache holds the large chunks read in
    slabs), block reads of many leaves in flight (``DIFF_IN_FLIGHT`` pairs, ``held_bytes`` a
    side), compared in order as they arrive."""
    tasks_a = [ScanTask(j.x.name, j.x.array, j.x.database) for j in jobs if j.x.array]
    tasks_b = [ScanTask(j.y.name, j.y.array, j.y.database) for j in jobs if j.y.array]
    pending: deque[tuple[_Job, Any, Any, int]] = deque()
    held = [0]

    def consume() -> None:
        job, fa, fb, n = pending.popleft()
        held[0] -= n
        if job.error is None:
            try:
                job.acc.add(fa.result(), fb.result())
            except Exception as e:
                job.error = first_line(e)
        on_bytes(n)

    pairs = zip(
        open_readers(sa, tasks_a, caches[0]), open_readers(sb, tasks_b, caches[1]), strict=True
    )
    for job, ((_, ra), (_, rb)) in zip(jobs, pairs, strict=True):
        x, y = job.x.array, job.y.array
        assert x is not None and y is not None
        if isinstance(ra, CkptError) or isinstance(rb, CkptError):
            job.error = (ra if isinstance(ra, CkptError) else rb).message  # type: ignore[union-attr]
            continue
        if _compare_streamed(job, ra, rb, budget, on_bytes):
            continue
        for sl in pair_blocks(x, y, budget):
            nbytes = math.prod(s.stop - s.start for s in sl) * x.itemsize
            try:
                pending.append((job, read_block(ra, sl), read_block(rb, sl), nbytes))
            except Exception as e:
                job.error = first_line(e)
                break
            held[0] += nbytes
            while pending and (len(pending) >= DIFF_IN_FLIGHT or held[0] > held_bytes):
                consume()
    while pending:
        consume()


def _compare_streamed(
    job: _Job, ra: LeafReader, rb: LeafReader, budget: int, on_bytes: Callable[[int], None]
) -> bool:
    """Compare a pair whose chunks exceed the budget slab by slab, both sides streamed
    (``format.chunkstream``: memory does not follow the chunk size); False when either side
    cannot be streamed or the two are chunked differently (then TensorStore reads them)."""
    x, y = job.x.array, job.y.array
    assert x is not None and y is not None
    if (x.shape, x.chunk_shape, x.itemsize) != (y.shape, y.chunk_shape, y.itemsize):
        return False
    slabs_a = streamed_slabs(x, ra, budget)
    slabs_b = streamed_slabs(y, rb, budget) if slabs_a is not None else None
    if slabs_a is None or slabs_b is None:
        return False
    job.streamed = True
    try:
        for (_, a), (_, b) in zip(slabs_a, slabs_b, strict=True):
            job.acc.add(a, b)
            on_bytes(a.nbytes)
    except Exception as e:
        job.error = first_line(e)
    return True


# The blocks read of a pair of arrays, and the element-wise comparison applied to each pair.


def pair_blocks(a: ArrayInfo, b: ArrayInfo, budget: int) -> Any:
    """Blocks of at most ``budget`` bytes: slabs of A's chunks when one exceeds the budget,
    else whole chunks aligned to both chunkings when their common multiple stays small, else
    to A's."""
    if is_large(a, budget):
        return stream_blocks(a, budget)
    lcm = tuple(
        min(s, math.lcm(ca or 1, cb or 1))
        for s, ca, cb in zip(a.shape, a.chunk_shape, b.chunk_shape, strict=True)
    )
    if math.prod(lcm) * max(a.itemsize, b.itemsize) <= 4 * budget:
        return iter_blocks(a, block_shape(replace(a, chunk_shape=lcm), budget))
    return iter_blocks(a, block_shape(a, budget))


class Compare:
    """Running totals of one pair of arrays compared block by block: elements outside the
    tolerance, the largest absolute and relative difference."""

    def __init__(self, atol: float, rtol: float, exact_ints: bool) -> None:
        self.atol = atol
        self.rtol = rtol
        self.exact_ints = exact_ints
        self.mismatched = 0
        self.max_abs = 0.0
        self.max_rel = 0.0

    def add(self, a: Any, b: Any) -> None:
        import numpy as np

        a, b = np.asarray(a), np.asarray(b)
        if a.dtype == b.dtype and a.dtype.itemsize in (1, 2, 4, 8) and a.shape == b.shape:
            # Equal bits are equal values (the same NaN too): most blocks of most diffs are
            # unchanged, and one integer comparison costs far less than the float64 pass.
            bits = f"u{a.dtype.itemsize}"
            if np.array_equal(a.view(bits), b.view(bits)):
                return
        exact = self.exact_ints and a.dtype.kind in "iub" and not (self.atol or self.rtol)
        if exact:
            # Integers compare in their own dtype: float64 would round int64 beyond 2**53.
            neq = a != b
            self.mismatched += int(np.count_nonzero(neq))
            a, b = a[neq], b[neq]
        if a.dtype.kind == "c" or b.dtype.kind == "c":
            # Complex values differ in their imaginary parts too: compared as complex128, the
            # distance is |a - b|; NaN equals NaN part by part.
            af, bf = a.astype(np.complex128), b.astype(np.complex128)
            same = _same(af.real, bf.real) & _same(af.imag, bf.imag)
        else:
            af, bf = a.astype(np.float64), b.astype(np.float64)
            same = _same(af, bf)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.where(same, 0.0, np.abs(af - bf))
            if not exact:
                ok = same | (diff <= self.atol + self.rtol * np.abs(bf))
                self.mismatched += int(np.count_nonzero(~ok))
            if not diff.size:
                return
            bad = ~np.isfinite(diff)  # NaN against a number, Inf against a finite value
            self.max_abs = max(self.max_abs, math.inf if bad.any() else float(diff.max()))
            # Equal values have no relative difference: a NaN or Inf on both sides would make
            # 0 / |b| NaN and hide the block's largest relative difference.
            rel = ~bad & ~same & (bf != 0)
            if rel.any():
                self.max_rel = max(self.max_rel, float((diff[rel] / np.abs(bf[rel])).max()))


def _same(a: Any, b: Any) -> Any:
    import numpy as np

    return (a == b) | (np.isnan(a) & np.isnan(b))
