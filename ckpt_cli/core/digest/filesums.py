"""File CRC-32s in byte ranges, spread over workers and joined.

A digest record holds one CRC-32 per data file, and an OCDBT data file often holds most of an
item: read by one process it is one per-process bandwidth cap long. CRC-32 can be split: the
CRC-32 of ``A + B`` follows from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (``crc.crc32_combine``:
ISA-L's, else zlib's algorithm in Python), so a file is cut into byte ranges
(``cut_ranges``), each range is checksummed on any worker (``checksum_ranges``, a unit) and
the driver joins them in order (``join_ranges``). Used by ``verify --deep`` on workers and by
scaled-out writers recording the files they wrote.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ckpt_cli.core.digest.crc import crc32, crc32_combine
from ckpt_cli.core.digest.records import (
    FileSum,
    LeafDigest,
    file_checksum,
    record_of,
    recorded_file,
    write_digests,
)
from ckpt_cli.core.executor import Executor
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.errors import CkptError, StorageError

#: A range is read in reads of this size, ``RANGE_READS`` at once (memory: their product).
RANGE_READ_BYTES = 4 << 20
RANGE_READS = 8
#: Ranges of the local files a writer just wrote, summed on this process's threads.
LOCAL_RANGE_BYTES = 32 << 20

#: (item-relative path, start, end) of one byte range of a file.
Range = tuple[str, int, int]
#: (path, start, bytes read, CRC-32 of them) of a range, or (path, start, 0, error message).
Piece = tuple[str, int, int, int | str]


@dataclass(frozen=True)
class RangeUnit:
    """Byte ranges of files under ``item`` (a URL) to checksum on a worker."""

    item: str
    ranges: tuple[Range, ...]
    storage: StorageOptions = field(default_factory=StorageOptions)

    @property
    def nbytes(self) -> int:
        return sum(end - start for _, start, end in self.ranges)


def cut_ranges(files: Iterable[tuple[str, int]], unit_bytes: int) -> Iterator[tuple[Range, ...]]:
    """Groups of ranges of at most ``unit_bytes``: a larger file cut, smaller files grouped."""
    group: list[Range] = []
    size = 0
    for rel, nbytes in files:
        for start in range(0, max(nbytes, 1), unit_bytes):
            end = min(nbytes, start + unit_bytes)
            if group and size + end - start > unit_bytes:
                yield tuple(group)
                group, size = [], 0
            group.append((rel, start, end))
            size += end - start
    if group:
        yield tuple(group)


def checksum_ranges(unit: RangeUnit) -> tuple[Piece, ...]:
    """Read and checksum a unit's ranges (runs on a worker; errors travel back as pieces)."""
    location = open_location(unit.item, unit.storage)
    return tuple(range_checksum(location, *r) for r in unit.ranges)


def range_checksum(location: Location, rel: str, start: int, end: int) -> Piece:
    """CRC-32 of bytes ``[start, end)`` of a file under ``location``, in ranged reads, several
    at once."""
    target = location.child(*rel.split("/"))
    crc = 0
    step = RANGE_READ_BYTES * RANGE_READS
    try:
        if location.parallel_reads <= 1:  # a local disk: one read at a time, one buffer
            for view in target.scan(start, end, RANGE_READ_BYTES):
                crc = crc32(view, crc)
            return rel, start, end - start, crc
        for a in range(start, end, step):
            cuts = range(a, min(end, a + step), RANGE_READ_BYTES)
            wanted = [(target, c, min(end, c + RANGE_READ_BYTES)) for c in cuts]
            for data in location.read_ranges(wanted):
                crc = crc32(data, crc)
    except CkptError as e:
        return rel, start, 0, e.message
    return rel, start, end - start, crc


def join_ranges(pieces: Iterable[Piece]) -> list[tuple[str, FileSum | str]]:
    """Each file's size and CRC-32 from its pieces (the first error, if a range failed)."""
    out: list[tuple[str, FileSum | str]] = []
    by_file: dict[str, list[tuple[int, int, int | str]]] = {}
    for rel, start, nbytes, got in pieces:
        by_file.setdefault(rel, []).append((start, nbytes, got))
    for rel, parts in sorted(by_file.items()):
        crc, size, error = 0, 0, None
        for _, nbytes, got in sorted(parts, key=lambda p: p[0]):
            if isinstance(got, str):
                error = error or got
                continue
            crc, size = crc32_combine(crc, got, nbytes), size + nbytes
        out.append((rel, error if error is not None else FileSum(size, f"{crc:08x}")))
    return out


class ReadTaps:
    """CRC-32s of the byte ranges of local files that readers read anyway (``verify --deep``
    decoding chunks from their data files: ``chunkread.Place.tap``), so a file's CRC-32 needs
    only the bytes no reader read (``gaps``), not the whole file a second time. A range that
    starts where an earlier one of the same file ended extends it (one run per chunk, or
    several chunks read in file order)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._runs: dict[str, dict[int, tuple[int, int]]] = {}  # file -> end -> (start, crc)

    def tap(self, rel: str) -> Callable[[int, memoryview], None]:
        """What a reader of ``rel`` (item-relative) calls with each range it read."""
        return functools.partial(self.add, rel)

    def add(self, rel: str, offset: int, data: memoryview) -> None:
        crc, end = crc32(data), offset + len(data)
        with self._lock:
            runs = self._runs.setdefault(rel, {})
            before = runs.pop(offset, None)  # a run that ends where this range starts
            if before is not None:
                offset, crc = before[0], crc32_combine(before[1], crc, len(data))
            runs[end] = (offset, crc)

    def pieces(self, rel: str, size: int) -> tuple[list[Piece], list[Range]]:
        """The file's tapped ranges that do not overlap (as pieces) and the ranges between
        them no reader read (to read and sum), together all of ``[0, size)``."""
        with self._lock:
            runs = sorted(
                (start, end, crc) for end, (start, crc) in self._runs.get(rel, {}).items()
            )
        pieces: list[Piece] = []
        gaps: list[Range] = []
        at = 0
        for start, end, crc in runs:
            if start < at or end > size:
                continue  # overlaps a run taken (its bytes are a gap's), or past the file's end
            if start > at:
                gaps.append((rel, at, start))
            pieces.append((rel, start, end - start, crc))
            at = end
        if at < size:
            gaps.append((rel, at, size))
        return pieces, gaps


def record_digests(
    item_dir: Location,
    leaf_digests: dict[str, LeafDigest] | None,
    executor: Executor | None = None,
) -> None:
    """``leaf_digests`` recorded with the checksums of the files ``item_dir`` holds now (read
    back by ``executor``'s workers in byte ranges, when given)."""
    if leaf_digests:
        sums = file_sums(item_dir) if executor is None else file_sums_on(item_dir, executor)
        write_digests(item_dir, record_of(leaf_digests, sums))


def file_sums(item_dir: Location) -> dict[str, FileSum]:
    """CRC-32 of every recorded file just written: on a local disk in byte ranges of
    ``LOCAL_RANGE_BYTES`` on this process's threads (``crc.crc32`` gives the GIL up while it sums), joined
    in order (one thread reading a 4 GiB step back took a tenth of a reshard's time on a
    13-core host); on object stores 4 files at a time (each with its own ranged reads in
    flight), as the files are read back from the store."""
    from concurrent.futures import ThreadPoolExecutor

    from ckpt_cli.core.threads import threads

    listed = [(rel, e.size) for rel, e in item_dir.walk() if recorded_file(rel)]
    if item_dir.parallel_reads <= 1:
        n = threads()
        ranges = [r for group in cut_ranges(sorted(listed), LOCAL_RANGE_BYTES) for r in group]
        if n <= 1 or len(ranges) <= 1:
            return {rel: file_checksum(item_dir.child(*rel.split("/"))) for rel, _ in listed}
        with ThreadPoolExecutor(min(n, len(ranges)), thread_name_prefix="ckpt-hash") as pool:
            pieces = list(pool.map(lambda r: range_checksum(item_dir, *r), ranges))
        return _joined(item_dir, pieces)
    rels = [rel for rel, _ in listed]

    def one(rel: str) -> FileSum:
        return file_checksum(item_dir.child(*rel.split("/")))

    if len(rels) <= 1:
        return {rel: one(rel) for rel in rels}
    with ThreadPoolExecutor(min(4, len(rels))) as pool:
        return dict(zip(rels, pool.map(one, rels), strict=True))


def _joined(item_dir: Location, pieces: list[Piece]) -> dict[str, FileSum]:
    """Each file's sum from its ranges' pieces; the first range that failed raises."""
    sums = dict(join_ranges(pieces))
    failed = next(((rel, got) for rel, got in sums.items() if isinstance(got, str)), None)
    if failed is not None:
        raise StorageError(f"cannot read back {failed[0]} in {item_dir}: {failed[1]}")
    return {rel: got for rel, got in sums.items() if isinstance(got, FileSum)}


#: Bytes of a file-checksum unit when the workers read the written files back.
RANGE_UNIT_BYTES = 32 << 20


def file_sums_on(item_dir: Location, executor: Executor) -> dict[str, FileSum]:
    """``file_sums`` by the workers: the written files cut into byte ranges of
    ``RANGE_UNIT_BYTES``, checksummed by any worker, joined here (one driver reading a step's
    data files back alone would take longer than the workers took to write them)."""
    files = sorted((rel, e.size) for rel, e in item_dir.walk() if recorded_file(rel))
    units = (
        RangeUnit(str(item_dir), ranges, item_dir.options)
        for ranges in cut_ranges(files, RANGE_UNIT_BYTES)
    )
    pieces = [p for done in executor.map(checksum_ranges, units) for p in done]
    return _joined(item_dir, pieces)
