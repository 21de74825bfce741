"""``verify --deep`` over units on an executor: decoding, NaN/Inf counts, leaf digests and file
checksums run on the workers; the driver only adds up the results and judges them.

A version-1 record's leaf digest is SHA-256 over the values in C order (``digests.py``): a hash
state cannot be split and joined, so a leaf whose SHA-256 is wanted (such a record to check) is
read by one worker, start to end, in one unit (small leaves share a unit). Hashing there costs
about 0.6 s per GB, far below the read, and the bytes never travel to the driver. Any other
leaf (no record, or ``ld1``: a version-2 record, ``--record``) is cut into chunk-aligned blocks
spread over units like a write: its NaN/Inf counts add up and its ``ld1`` partials merge
(``ld1.merge``, any order). File CRC-32s: small files grouped into units by bytes; a file
larger than a unit (an OCDBT data file often holds most of an item) is cut into byte ranges of
about a unit, each unit reads and checksums one, and the driver joins the CRC-32s of the ranges
(``digest/filesums.py``): one worker reading a whole large file alone at its per-process
bandwidth would otherwise set the run's time.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from ckpt_cli.core.digest.filesums import Piece, join_ranges, range_checksum
from ckpt_cli.core.digest.ld1 import Partial, merge
from ckpt_cli.core.digest.records import FileSum, Wanted, file_checksum, string_digest
from ckpt_cli.core.executor import Executor
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.blocks import block_shape, iter_blocks
from ckpt_cli.core.format.scan import scan_leaves
from ckpt_cli.core.format.scan_acc import LeafScan, ScanTask
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.verify.deep import _data_files, _done, _take_scan, _take_sums, deep_item
from ckpt_cli.core.verify.types import DataResult, ItemFacts
from ckpt_cli.errors import CkptError

DEFAULT_SCAN_UNIT_BYTES = 256 << 20


@dataclass(frozen=True)
class ScanUnit:
    item: str  # URL of the item directory
    zarr3: bool
    budget: int
    tasks: tuple[ScanTask, ...]
    files: tuple[tuple[str, int], ...]  # (item-relative path, size)
    #: How the worker reaches the item (the driver's options).
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: The deep pass the unit belongs to: a worker reuses the item's opened store for it.
    run: str = ""
    #: Byte ranges of a file larger than a unit: (item-relative path, start, end).
    ranges: tuple[tuple[str, int, int], ...] = ()

    @property
    def nbytes(self) -> int:
        arrays = sum(_task_bytes(t) for t in self.tasks)
        pieces = sum(end - start for _, start, end in self.ranges)
        return arrays + sum(size for _, size in self.files) + pieces


@dataclass(frozen=True)
class ScanDone:
    scans: tuple[LeafScan, ...]
    sums: tuple[tuple[str, FileSum | str], ...]
    nbytes: int
    seconds: float = 0.0  # spent in the unit, on its worker
    #: The checksums of the unit's ranges (``filesums.Piece``).
    pieces: tuple[Piece, ...] = ()


def _task_bytes(task: ScanTask) -> int:
    if task.blocks is None:
        return int(task.info.nbytes)
    return int(
        sum(math.prod(s.stop - s.start for s in b) for b in task.blocks) * task.info.itemsize
    )


def plan_scan_units(
    facts: ItemFacts, want_digests: Wanted, budget: int, unit_bytes: int
) -> Iterator[ScanUnit]:
    """The units of ``facts``'s deep pass, yielded as they are cut (the executor submits each
    at once): array units in leaf order, then the file checksum units."""
    assert facts.store is not None
    run = uuid.uuid4().hex
    for unit in _array_units(facts, want_digests, budget, unit_bytes):
        yield replace(unit, run=run)
    if want_digests and facts.inventory is not None:
        base, zarr3 = str(facts.inventory.base), facts.store.use_zarr3
        storage = facts.store.item.options
        group: list[tuple[str, int]] = []
        size = 0
        for rel in _data_files(facts):
            nbytes = facts.inventory.sizes.get(rel) or 0
            if nbytes > unit_bytes:
                for start in range(0, nbytes, unit_bytes):
                    piece = ((rel, start, min(nbytes, start + unit_bytes)),)
                    yield ScanUnit(base, zarr3, budget, (), (), storage, ranges=piece)
                continue
            group.append((rel, nbytes))
            size += nbytes
            if size >= unit_bytes:
                yield ScanUnit(base, zarr3, budget, (), tuple(group), storage)
                group, size = [], 0
        if group:
            yield ScanUnit(base, zarr3, budget, (), tuple(group), storage)


def _array_units(
    facts: ItemFacts, want_digests: Wanted, budget: int, unit_bytes: int
) -> Iterator[ScanUnit]:
    assert facts.store is not None
    item, zarr3 = str(facts.store.item), facts.store.use_zarr3
    storage = facts.store.item.options
    units: list[ScanUnit] = []  # cut but not yet yielded
    tasks: list[ScanTask] = []
    size = 0
    ld1 = want_digests.ld1

    def flush() -> None:
        nonlocal tasks, size
        if tasks:
            units.append(ScanUnit(item, zarr3, budget, tuple(tasks), (), storage))
        tasks, size = [], 0

    for name, (info, label) in sorted(facts.arrays.items()):
        if want_digests.sha256 or info.nbytes <= unit_bytes:
            tasks.append(
                ScanTask(name, info, label, digest=want_digests.sha256, ld1=want_digests.ld1)
            )
            size += info.nbytes
        else:
            blocks: list[tuple[slice, ...]] = []
            for block in iter_blocks(info, block_shape(info, min(budget, unit_bytes))):
                nbytes = math.prod(s.stop - s.start for s in block) * info.itemsize
                if (blocks or tasks) and size + nbytes > unit_bytes:
                    if blocks:
                        tasks.append(ScanTask(name, info, label, blocks=tuple(blocks), ld1=ld1))
                        blocks = []
                    flush()
                    yield from units
                    units.clear()
                blocks.append(block)
                size += nbytes
            tasks.append(ScanTask(name, info, label, blocks=tuple(blocks), ld1=ld1))
        if size >= unit_bytes:
            flush()
        yield from units
        units.clear()
    flush()
    yield from units


#: Opened stores a worker keeps, by (run, item URL, zarr3): the units of one deep pass after
#: the first skip the listing, the OCDBT manifest and the headers (round trips, each a full
#: latency with nothing else in flight). Keyed by run: a later pass sees a changed item.
_STORES: dict[tuple[str, str, bool], ItemStore] = {}
_STORES_LOCK = threading.Lock()
_KEPT_STORES = 4


def _store(unit: ScanUnit, location: Location) -> ItemStore:
    key = (unit.run, unit.item, unit.zarr3)
    with _STORES_LOCK:
        if not unit.run:
            return ItemStore(location, unit.zarr3)
        if key not in _STORES:
            while len(_STORES) >= _KEPT_STORES:
                del _STORES[next(iter(_STORES))]
            _STORES[key] = ItemStore(location, unit.zarr3)
        return _STORES[key]


def run_scan_unit(unit: ScanUnit) -> ScanDone:
    """Decode a unit's blocks and checksum its files (runs on a worker; never raises for
    damage: errors travel back as results, as in the single-process pass)."""
    started = time.monotonic()
    location = open_location(unit.item, unit.storage)
    scans: tuple[LeafScan, ...] = ()
    if unit.tasks:
        scans = tuple(scan_leaves(_store(unit, location), unit.tasks, unit.budget))
    sums: list[tuple[str, FileSum | str]] = []
    for rel, _ in unit.files:
        try:
            sums.append((rel, file_checksum(location.child(*rel.split("/")))))
        except CkptError as e:
            sums.append((rel, e.message))
    pieces = tuple(range_checksum(location, *r) for r in unit.ranges)
    return ScanDone(scans, tuple(sums), unit.nbytes, time.monotonic() - started, pieces)


def deep_item_scaled(
    facts: ItemFacts,
    want_digests: Wanted,
    budget: int,
    executor: Executor,
    unit_bytes: int = DEFAULT_SCAN_UNIT_BYTES,
    on_bytes: Callable[[int], None] | None = None,
) -> DataResult:
    """``deep.deep_item`` with the reading done by ``executor``'s workers."""
    if facts.store is None:
        return deep_item(facts, want_digests, budget, on_bytes)
    result = DataResult([], {}, {})
    if facts.store is not None:
        units = plan_scan_units(facts, want_digests, budget, unit_bytes)
        done = executor.map(
            run_scan_unit, units, (lambda d: on_bytes(d.nbytes)) if on_bytes else None
        )
        for scan in _join_scans([s for d in done for s in d.scans]):
            _take_scan(facts, result, scan, facts.arrays[scan.name][0])
        sums = [(rel, got) for d in done for rel, got in d.sums]
        sums += join_ranges([p for d in done for p in d.pieces])
        _take_sums(facts, result, [(rel, _done(got)) for rel, got in sums])
        result.units = len(done)
        result.worker_seconds = sum(d.seconds for d in done)
    for name, value in facts.strings.items():
        result.digests[name] = string_digest(value)
    return result


def _merged(a: Partial | None, b: Partial | None) -> Partial | None:
    return None if a is None or b is None else merge([a, b])


def _join_scans(scans: list[LeafScan]) -> list[LeafScan]:
    """One result per leaf from the parts of a leaf split over units (counts add up)."""
    joined: dict[str, LeafScan] = {}
    for s in scans:
        prev = joined.get(s.name)
        joined[s.name] = (
            s
            if prev is None
            else replace(
                prev,
                nan=prev.nan + s.nan,
                inf=prev.inf + s.inf,
                error=prev.error or s.error,
                bytes=prev.bytes + s.bytes,
                blocks=prev.blocks + s.blocks,
                partial=_merged(prev.partial, s.partial),
            )
        )
    return sorted(joined.values(), key=lambda s: s.name)
