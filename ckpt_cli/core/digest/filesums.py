"""File CRC-32s in byte ranges, spread over workers and joined.

A digest record holds one CRC-32 per data file, and an OCDBT data file often holds most of an
item: read by one process it is one per-process bandwidth cap long. CRC-32 can be split: the
CRC-32 of ``A + B`` follows from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's
``crc32_combine``, which Python's ``zlib`` does not expose), so a file is cut into byte ranges
(``cut_ranges``), each range is checksummed on any worker (``checksum_ranges``, a unit) and
the driver joins them in order (``join_ranges``). Used by ``verify --deep`` on workers and by
scaled-out writers recording the files they wrote.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ckpt_cli.core.digest.records import FileSum
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.errors import CkptError

#: A range is read in reads of this size, ``RANGE_READS`` at once (memory: their product).
RANGE_READ_BYTES = 4 << 20
RANGE_READS = 8

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
        for a in range(start, end, step):
            cuts = range(a, min(end, a + step), RANGE_READ_BYTES)
            wanted = [(target, c, min(end, c + RANGE_READ_BYTES)) for c in cuts]
            for data in location.read_ranges(wanted):
                crc = zlib.crc32(data, crc)
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


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc32(A)``, ``crc32(B)`` and ``len(B)``: zlib's
    algorithm, ``len2`` zero bytes applied to ``crc1`` by squaring the one-zero-bit operator
    in GF(2)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)  # the first pass: one zero byte
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2
