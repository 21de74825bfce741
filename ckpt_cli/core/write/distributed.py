"""Write an item's arrays from many workers: units of chunk-aligned regions, per-worker OCDBT
databases, one merge and one commit on the driver.

Units: the output blocks of every array leaf (whole output chunks, as the single-process writer
cuts them) grouped in order into units of about ``unit_bytes``; a big leaf spans many units, small
leaves share one. A unit is data only (``WriteUnit``: URLs, leaf names, regions and a
``SourcePlan``), rebuilt on the worker, so a remote ``Location`` works unchanged.

Concurrent writers: every worker process writes into its own OCDBT database
``<item>/ocdbt.process_w<id>/`` (one per process and run), the driver stores every zarr header
in the item's root database first and, after all units succeeded, copies the b-trees of the
databases that completed units into the root in one atomic transaction
(``KvStore.experimental_copy_range_to``): the layout and the merge Orbax itself uses for
multi-host saves (``ocdbt_utils.merge_ocdbt_per_process_files``; Orbax accepts alphanumeric
process ids). TensorStore's distributed coordinator was not chosen: it needs a server every worker
reaches and leaves one database whose writers contend on one manifest.

Idempotence: a unit writes whole chunks with deterministic encodings, so running it again (after
a worker died) writes the same bytes. A dead worker's database stays consistent at its last
committed version; if it completed no unit that the driver received, it is deleted before the
commit, otherwise it is merged and any chunk it shares with a retry holds equal bytes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from ckpt_cli.core.digest.ld1 import Partial
from ckpt_cli.core.digest.records import BlockDigests
from ckpt_cli.core.executor import Executor
from ckpt_cli.core.format.arrays import ItemStore, cached_context
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.write.item import OCDBT_CONFIG, ItemWriter
from ckpt_cli.core.write.pipeline import block_budget, leaf_regions
from ckpt_cli.core.write.types import ArrayOut, LeafOut, Region, SourcePlan
from ckpt_cli.errors import StorageError, UnsupportedError

DEFAULT_UNIT_BYTES = 256 << 20
WORKER_DB_PREFIX = "ocdbt.process_w"
#: Runs a long-lived worker keeps state for (open stores, its database name).
_KEPT_RUNS = 4


@dataclass(frozen=True)
class UnitLeaf:
    """Some regions of one output leaf, with what computes them."""

    keypath: tuple[str, ...]
    array: ArrayOut
    plan: SourcePlan
    source_chunks: tuple[int, ...] | None
    regions: tuple[Region, ...]
    #: Take the ``ld1`` partials of these regions (a carried digest the driver checks).
    ld1: bool = False
    #: Take the SHA-256 of the leaf (a carried version-1 digest: the whole leaf is in this unit).
    sha256: bool = False
    #: ``LeafOut.source_itemsize``: the worker's pipeline counts a cast's source values too.
    source_itemsize: int | None = None
    #: ``LeafOut.fresh_blocks``: the worker hands TensorStore the blocks without a copy.
    fresh_blocks: bool = False

    @property
    def name(self) -> str:
        return ".".join(self.keypath)

    @property
    def nbytes(self) -> int:
        itemsize = dtype_itemsize(self.array.dtype)
        return sum(math.prod(s.stop - s.start for s in r) * itemsize for r in self.regions)


@dataclass(frozen=True)
class WriteUnit:
    """One idempotent piece of a scaled-out write."""

    run: str
    index: int
    dest: str  # URL of the item directory being written (inside the tmp step)
    use_ocdbt: bool
    memory_limit: int
    leaves: tuple[UnitLeaf, ...]
    #: How the worker reaches the destination and the sources (the driver's options).
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: The writer's ``finite_label``: NaN/Inf refused (None: written as they are).
    finite_label: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)


@dataclass(frozen=True)
class UnitDone:
    index: int
    database: str | None  # the worker database holding the unit's chunks (OCDBT)
    nbytes: int
    seconds: float
    worker: str  # host:pid
    #: Leaf -> the ``ld1`` partial of the unit's regions (leaves with a carried digest).
    partials: tuple[tuple[str, Partial], ...] = ()
    #: Leaf -> SHA-256 of its values in C order (None: not written in C order).
    sha256: tuple[tuple[str, str | None], ...] = ()


class ScaleJSON(TypedDict):
    executor: str
    workers: int
    units: int
    databases: int
    worker_seconds: float
    merge_seconds: float
    split: bool
    reason: str | None


@dataclass(frozen=True)
class ScaleStats:
    executor: str
    workers: int
    units: int
    databases: int
    worker_seconds: float  # summed time inside units
    merge_seconds: float
    split: bool = True  # False: the run stayed in one process (``reason`` says why)
    reason: str | None = None

    def to_json(self) -> ScaleJSON:
        return {
            "executor": self.executor,
            "workers": self.workers,
            "units": self.units,
            "databases": self.databases,
            "worker_seconds": round(self.worker_seconds, 3),
            "merge_seconds": round(self.merge_seconds, 3),
            "split": self.split,
            "reason": self.reason,
        }


def plan_write_units(
    leaves: Sequence[LeafOut],
    dest: Location,
    *,
    use_ocdbt: bool,
    memory_limit: int,
    unit_bytes: int,
    run: str | None = None,
    finite_label: str | None = None,
) -> Iterator[WriteUnit]:
    """Cut the blocks of every array leaf into units of about ``unit_bytes``, in leaf order,
    each yielded as it is cut (the executor submits it at once). A leaf whose plan cannot be
    split (a whole-leaf migrate expression) stays in one unit."""
    run = run or uuid.uuid4().hex
    # Blocks no bigger than a unit (when the chunks allow), so units stay near ``unit_bytes``.
    budget = min(block_budget(memory_limit), max(1, unit_bytes))
    units: list[WriteUnit] = []  # cut, the ones not yet yielded after ``sent``
    sent = 0
    current: list[UnitLeaf] = []
    size = 0
    blank = WriteUnit(run, 0, str(dest), use_ocdbt, memory_limit, (), dest.options, finite_label)

    def flush() -> None:
        nonlocal current, size
        if current:
            units.append(dataclasses.replace(blank, index=len(units), leaves=(*current,)))
        current, size = [], 0

    for leaf in leaves:
        if leaf.array is None or leaf.source is None:
            continue
        if leaf.plan is None:
            raise UnsupportedError(
                f"leaf {leaf.name!r} has no description a worker can rebuild",
                hint="run without --executor/--workers",
            )
        itemsize = dtype_itemsize(leaf.array.dtype)
        regions: list[Region] = []
        for region in leaf_regions(leaf, budget):
            nbytes = math.prod(s.stop - s.start for s in region) * itemsize
            if leaf.plan.splittable and (regions or current) and size + nbytes > unit_bytes:
                if regions:
                    current.append(_unit_leaf(leaf, regions))
                    regions = []
                flush()
                yield from units[sent:]
                sent = len(units)
            regions.append(region)
            size += nbytes
        current.append(_unit_leaf(leaf, regions))
        if size >= unit_bytes:
            flush()
        yield from units[sent:]
        sent = len(units)
    flush()
    yield from units[sent:]


def _unit_leaf(leaf: LeafOut, regions: list[Region]) -> UnitLeaf:
    assert leaf.array is not None and leaf.plan is not None
    return UnitLeaf(
        leaf.keypath,
        leaf.array,
        leaf.plan,
        leaf.source_chunks,
        tuple(regions),
        source_itemsize=leaf.source_itemsize,
        fresh_blocks=leaf.fresh_blocks,
    )


# --- worker side -----------------------------------------------------------------------------


class _RunState:
    """What one worker process keeps for one run: its database and the opened source items."""

    def __init__(self, unit: WriteUnit) -> None:
        self.database = f"{WORKER_DB_PREFIX}{uuid.uuid4().hex[:12]}" if unit.use_ocdbt else None
        self.writer = ItemWriter(
            open_location(unit.dest, unit.storage),
            use_ocdbt=unit.use_ocdbt,
            use_zarr3=False,  # arrays carry their own zarr version; metadata is the driver's
            memory_limit=unit.memory_limit,
            database=self.database,
            assume_metadata=True,
            # A unit reports once done: whole blocks, through the cache its units share.
            slab_reads=False,
            # Each write synced here: the driver's sync at the commit reaches only the writes
            # of its own host (Dask workers may run on others).
            sync_each_write=True,
            finite_label=unit.finite_label,
        )
        self.cache = cached_context(unit.memory_limit // 8)
        self.storage = unit.storage
        self.stores: dict[tuple[str, bool], ItemStore] = {}
        self.lock = threading.Lock()

    def store(self, url: str, zarr3: bool) -> ItemStore:
        with self.lock:
            key = (url, zarr3)
            if key not in self.stores:
                location = open_location(url, self.storage)
                self.stores[key] = ItemStore(location, zarr3, self.cache)
            return self.stores[key]


_RUNS: dict[str, _RunState] = {}
_RUNS_LOCK = threading.Lock()


def _run_state(unit: WriteUnit) -> _RunState:
    with _RUNS_LOCK:
        if unit.run not in _RUNS:
            while len(_RUNS) >= _KEPT_RUNS:
                del _RUNS[next(iter(_RUNS))]
            _RUNS[unit.run] = _RunState(unit)
        return _RUNS[unit.run]


def run_write_unit(unit: WriteUnit) -> UnitDone:
    """Write one unit's regions into this process's database (runs on a worker)."""
    started = time.monotonic()
    state = _run_state(unit)
    jobs = []
    for part in unit.leaves:
        store = state.store(part.plan.source, part.plan.source_zarr3)
        leaf = LeafOut(
            keypath=part.keypath,
            key_types=(),
            value_type="",
            array=part.array,
            source=part.plan.build(store),
            source_chunks=part.source_chunks,
            source_itemsize=part.source_itemsize,
            fresh_blocks=part.fresh_blocks,
        )
        jobs.append((leaf, part.regions))
    wanted = BlockDigests(
        {},
        [p.name for p in unit.leaves if p.ld1],
        {p.name: None for p in unit.leaves if p.sha256},
    )
    taken = state.writer.write_regions(jobs, expect=wanted)
    return UnitDone(
        unit.index,
        state.database,
        unit.nbytes,
        time.monotonic() - started,
        f"{socket.gethostname()}:{os.getpid()}",
        tuple(sorted(taken.partials.items())),
        tuple(sorted(taken.sha256_found().items())),
    )


# --- driver side -----------------------------------------------------------------------------


def write_arrays_scaled(
    item: ItemWriter,
    leaves: Sequence[LeafOut],
    executor: Executor,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    expect: BlockDigests | None = None,
) -> tuple[ScaleStats, BlockDigests]:
    """Create every array (headers, by the driver), run the units on ``executor``, then merge
    the worker databases into the item's root database. Raises if any unit failed: the caller
    then deletes the tmp step, so nothing valid-looking is left.

    ``expect``: carried digests. The workers take the ``ld1`` partials of their regions (and the
    SHA-256 of a version-1 leaf written whole by one unit); the driver merges them per leaf and
    raises ``SourceDigestError`` on a difference, before the databases are merged. Returns the
    figures and the digests taken (``unchecked``: version-1 ones no unit could take)."""
    written = {leaf.name for leaf in leaves if leaf.array is not None and leaf.source}
    digests = (expect or BlockDigests({})).restrict(written)
    units = _with_digests(
        plan_write_units(
            leaves,
            item.dest,
            use_ocdbt=item.use_ocdbt,
            # A worker runs ``units_per_worker`` units at once: each gets its share.
            memory_limit=max(1 << 20, item.memory_limit // executor.units_per_worker),
            unit_bytes=unit_bytes,
            finite_label=item.finite_label,
        ),
        digests,
    )
    _create_arrays(item, [leaf for leaf in leaves if leaf.array is not None and leaf.source])
    # Units are submitted as they are cut: the first runs while the planner cuts the rest.
    done = executor.map(run_write_unit, units, (lambda d: on_bytes(d.nbytes)) if on_bytes else None)
    _check_digests(digests, done)
    databases = sorted({d.database for d in done if d.database})
    started = time.monotonic()
    if item.use_ocdbt:
        merge_databases(item.dest, databases)
    stats = ScaleStats(
        executor.name,
        executor.workers,
        len(done),
        len(databases),
        sum(d.seconds for d in done),
        time.monotonic() - started,
    )
    return stats, digests


def _with_digests(units: Iterable[WriteUnit], digests: BlockDigests) -> Iterator[WriteUnit]:
    """The units as they are cut, told which leaves' digests to take: ``ld1`` partials of every
    carried leaf, the SHA-256 of a version-1 leaf only where one unit writes all of it (its
    regions, disjoint, hold every element: known without waiting for the rest of the plan)."""

    def whole(part: UnitLeaf) -> bool:
        held = sum(math.prod(int(s.stop) - int(s.start) for s in r) for r in part.regions)
        return held == math.prod(part.array.shape)

    def told(part: UnitLeaf) -> UnitLeaf:
        ld1 = part.name in digests.collect
        sha = part.name in digests.sha256 and whole(part)
        return replace(part, ld1=ld1, sha256=sha) if ld1 or sha else part

    for u in units:
        yield replace(u, leaves=tuple(told(p) for p in u.leaves))


def _check_digests(digests: BlockDigests, done: Sequence[UnitDone]) -> None:
    """Merge the workers' partials (one result per unit, whatever retries ran) and compare."""
    by_unit = {d.index: d for d in done}
    for result in by_unit.values():
        for name, box in result.partials:
            digests.absorb(name, box)
        digests.hashes.update(result.sha256)
    digests.check()


def _create_arrays(item: ItemWriter, arrays: list[LeafOut]) -> None:
    for start in range(0, len(arrays), 64):
        batch = [(leaf, item.open_array(leaf)) for leaf in arrays[start : start + 64]]
        for leaf, fut in batch:
            try:
                fut.result()
            except Exception as e:
                raise StorageError.from_error(
                    f"cannot create leaf {leaf.name!r} in {item.dest}", e
                ) from None


def merge_databases(item: Location, databases: Sequence[str]) -> None:
    """Copy the b-trees of ``databases`` (children of ``item``) into the item's root database in
    one atomic transaction; the data files stay where the workers wrote them. Worker databases
    not listed (a dead worker that completed nothing the driver received) are deleted."""
    import tensorstore as ts

    context = ts.Context()  # one context: copy_range_to needs both sides on the same kvstore

    def spec(loc: Location) -> dict[str, Any]:
        return {"driver": "ocdbt", "base": loc.kvstore_spec(), "config": OCDBT_CONFIG}

    try:
        root = ts.KvStore.open(spec(item), context=context).result()
        children = [ts.KvStore.open(spec(item.child(db)), context=context) for db in databases]
        txn = ts.Transaction(atomic=True)
        copies = [
            c.result().experimental_copy_range_to(root.with_transaction(txn)) for c in children
        ]
        for fut in copies:
            fut.result()
        txn.commit_async().result()
    except Exception as e:
        raise StorageError.from_error(f"cannot merge the worker databases of {item}", e) from None
    keep = set(databases)
    item.refresh()  # workers and TensorStore wrote objects a cached listing cannot know
    for entry in item.list():
        if entry.is_dir and entry.name.startswith(WORKER_DB_PREFIX) and entry.name not in keep:
            item.child(entry.name).delete_tree()
