"""Recorded digests: what ``verify --record`` stores in an item and later checks against.

Orbax stores no checksum over array data (FORMAT.md), so ckpt records its own, in
``<item>/_CKPT_DIGESTS.json``, written atomically (temporary name, then rename).

Leaf digest: SHA-256 over the leaf's values in C order, little-endian, nothing else (dtype and
shape are recorded and compared beside it). Why this scheme:

* It depends on the values only: not on chunking, compression, zarr version or OCDBT, so it
  survives ``reshard`` and ``migrate``. Anyone can reproduce it from a restored array on a
  little-endian host: ``hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()``.
* It streams: the array is read in C-order blocks (``c_order_block``) that span whole trailing
  dimensions, so consecutive blocks are consecutive byte ranges of the C-order stream and feed
  one running hash; memory stays at a block. A per-slab Merkle tree would allow hashing slabs
  out of order, but every slab still has to be assembled in C order first, so it saves
  nothing here and makes the digest harder to reproduce by hand.
* The cost: a compressed chunk decodes whole, so a block that cuts through chunks decodes them
  again for every block. Blocks therefore take whole chunk-rows along their split dimension
  (all chunks of the same rows, however the trailing dims are chunked, as ``P(None, 'model')``
  does) whenever one chunk-row fits in ``CHUNK_ROW_CAP`` (128 MiB), even past the block budget;
  only beyond that is a chunk decoded once per block that touches it.
* SHA-256 runs at about twice BLAKE2b's speed on CPUs with SHA extensions (measured here:
  1.6 vs 0.8 GB/s), and the leaf stream is hashed once.

File checksums: CRC-32 (``crc.crc32``: zlib's values, ISA-L's speed) and size of every file in
the item except the digest file itself. They tie the record to these exact bytes: a size check is free (structure
level), a checksum pass reads each file once (``--deep``), and ``--sample`` checks the files that
hold the sampled chunks. Writers that rewrite data (``reshard``, ``migrate``) keep ``leaves``
and recompute ``files``.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NotRequired, TypedDict

from ckpt_cli._version import __version__
from ckpt_cli.core.digest.crc import crc32
from ckpt_cli.core.digest.ld1 import Partial
from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.names import COMMIT_MARKER
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError, InvalidMetadataError, SourceDigestError

DIGEST_FILE = "_CKPT_DIGESTS.json"
#: ``verify --rotate``'s state, next to the digests (``verify/budget.py``): never recorded.
STATE_FILE = "_CKPT_VERIFY_STATE.json"
FORMAT_NAME = "ckpt-digests"
#: Version 1 records SHA-256 per leaf; version 2 records ``ld1`` (``ld1.py``): written by
#: ``verify --record`` on an item without a record (or with a version-2 one) and by
#: ``verify --record --upgrade``. Both are read and checked.
FORMAT_VERSION = 2
FORMAT_VERSIONS = (1, 2)
LEAF_ALGORITHM = "sha256 of values, C order, little-endian"
LEAF_ALGORITHM_LD1 = "ld1 (docs/reference/digest-spec.md)"
FILE_ALGORITHM = "crc32 (zlib) of file bytes"
_READ_PIECE = 8 << 20
CHUNK_ROW_CAP = 128 << 20


class LeafDigestJSON(TypedDict):
    dtype: str
    shape: list[int]
    sha256: NotRequired[str]  # version 1
    ld1: NotRequired[str]  # version 2
    #: NaN and Inf values the leaf holds, where the run that recorded it counted them
    nonfinite: NotRequired[int]


class FileSumJSON(TypedDict):
    size: int
    crc32: str


class DigestRecordJSON(TypedDict):
    """The digest file an item carries (its own format, not a --json document)."""

    format: str
    version: int
    tool: str
    created_at: str
    leaf_algorithm: str
    file_algorithm: str
    leaves: dict[str, LeafDigestJSON]
    files: dict[str, FileSumJSON]


@dataclass(frozen=True)
class LeafDigest:
    """A leaf's recorded digests: SHA-256 (``digest``, hex; version 1), ``ld1`` (version 2),
    or both while a run computes them (``--upgrade`` checks the one, records the other)."""

    dtype: str  # numpy-style name; "string" for string leaves
    shape: tuple[int, ...]
    digest: str | None  # SHA-256 hex
    ld1: str | None = None
    #: NaN and Inf values among the leaf's (None: not counted by what recorded it)
    nonfinite: int | None = None

    def to_json(self, version: int) -> LeafDigestJSON:
        out: LeafDigestJSON = {"dtype": self.dtype, "shape": list(self.shape)}
        if version == 1 and self.digest is not None:
            out["sha256"] = self.digest
        if version == 2 and self.ld1 is not None:
            out["ld1"] = self.ld1
        if self.nonfinite is not None:
            out["nonfinite"] = self.nonfinite
        return out


@dataclass(frozen=True)
class Wanted:
    """Which leaf digests a deep pass computes: SHA-256 (a version-1 record to check or to
    record again) and/or ``ld1`` (a version-2 record, or a record being written)."""

    sha256: bool = False
    ld1: bool = False

    def __bool__(self) -> bool:
        return self.sha256 or self.ld1


def wanted(record: DigestRecord | None, recording: bool, upgrade: bool = False) -> Wanted:
    """What to compute for an item: what its record holds, plus what ``--record`` writes
    (``ld1``, except that an item with a version-1 record keeps it unless ``upgrade``)."""
    has_sha = record is not None and any(d.digest for d in record.leaves.values())
    has_ld1 = record is not None and any(d.ld1 for d in record.leaves.values())
    writes_ld1 = recording and (upgrade or record is None or record.version == 2)
    return Wanted(has_sha or (recording and not writes_ld1), has_ld1 or writes_ld1)


@dataclass(frozen=True)
class FileSum:
    size: int
    crc32: str  # 8 hex digits


@dataclass(frozen=True)
class DigestRecord:
    leaves: dict[str, LeafDigest]
    files: dict[str, FileSum]  # item-relative path -> size and checksum
    tool: str = f"ckpt {__version__}"
    created_at: str = ""
    version: int = FORMAT_VERSION

    def to_json(self) -> DigestRecordJSON:
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "tool": self.tool,
            "created_at": self.created_at,
            "leaf_algorithm": LEAF_ALGORITHM_LD1 if self.version == 2 else LEAF_ALGORITHM,
            "file_algorithm": FILE_ALGORITHM,
            "leaves": {name: d.to_json(self.version) for name, d in sorted(self.leaves.items())},
            "files": {
                path: {"size": f.size, "crc32": f.crc32} for path, f in sorted(self.files.items())
            },
        }


def recorded_file(rel: str) -> bool:
    """Whether an item file belongs in the record's file checksums.

    Not the digest file itself (nor a temporary copy of it), and not ``commit_success.txt``:
    that is commit state, checked by the structure level, and a copy of a step may rightly lack
    it (Orbax issue #394) until ``verify --mark-committed`` writes it again.
    """
    name = rel.rsplit("/", 1)[-1]
    return not (
        rel == COMMIT_MARKER
        or name in (DIGEST_FILE, STATE_FILE)
        or name.lstrip(".").startswith((DIGEST_FILE + ".tmp-", STATE_FILE + ".tmp-"))
    )


def read_digests(item: Location) -> DigestRecord | None:
    """The item's digest record; None when it has none. Damage raises InvalidMetadataError."""
    loc = item.child(DIGEST_FILE)
    raw = loc.read_json_if_exists()
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise InvalidMetadataError(f"{loc} is not a ckpt digest file")
    version = raw.get("version")
    if version not in FORMAT_VERSIONS:
        raise InvalidMetadataError(
            f"{loc} has digest format version {version!r}; this ckpt reads versions "
            f"{', '.join(str(v) for v in FORMAT_VERSIONS)}",
            hint="upgrade ckpt",
        )
    try:
        key = "sha256" if version == 1 else "ld1"
        leaves = {
            str(name): LeafDigest(
                str(d["dtype"]),
                tuple(int(x) for x in d["shape"]),
                str(d[key]) if version == 1 else None,
                str(d[key]) if version == 2 else None,
                _count(d.get("nonfinite")),
            )
            for name, d in raw["leaves"].items()
        }
        files = {
            str(path): FileSum(int(f["size"]), str(f["crc32"])) for path, f in raw["files"].items()
        }
    except (KeyError, TypeError, ValueError, AttributeError):
        raise InvalidMetadataError(
            f"{loc} lacks the leaves/files layout of a digest file"
        ) from None
    tool, created = str(raw.get("tool", "")), str(raw.get("created_at", ""))
    return DigestRecord(leaves, files, tool, created, int(version))


def _count(value: Any) -> int | None:
    """A recorded count (``nonfinite``): a non-negative integer, else None (not recorded)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def record_of(
    leaves: dict[str, LeafDigest], files: dict[str, FileSum], ld1: bool | None = None
) -> DigestRecord:
    """A record of ``leaves``: version 2 (``ld1``) when ``ld1`` (default: when an array leaf
    carries one), else version 1 (SHA-256)."""
    if ld1 is None:
        ld1 = any(d.ld1 for d in leaves.values() if d.dtype != "string")
    return DigestRecord(leaves, files, version=2 if ld1 else 1)


def write_digests(item: Location, record: DigestRecord) -> Location:
    loc = item.child(DIGEST_FILE)
    stamped = DigestRecord(
        record.leaves,
        record.files,
        record.tool,
        record.created_at or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        record.version,
    )
    # Never create the item directory: a step deleted meanwhile (prune, an operator) must not
    # come back holding only this file.
    loc.write_bytes((json.dumps(stamped.to_json(), indent=1) + "\n").encode(), create_parents=False)
    return loc


def file_checksum(loc: Location) -> FileSum:
    """Size and CRC-32 of one file, streamed."""
    crc, size = 0, 0
    for piece in loc.scan(0, None, _READ_PIECE):
        crc = crc32(piece, crc)
        size += len(piece)
    return FileSum(size, f"{crc:08x}")


def string_digest(value: str) -> LeafDigest:
    """Both digests of a string leaf (its UTF-8 bytes)."""
    from ckpt_cli.core.digest.ld1 import digest_text

    return LeafDigest("string", (), hashlib.sha256(value.encode()).hexdigest(), digest_text(value))


def values_key(d: LeafDigest) -> str | None:
    """What identifies a leaf's values in a record: its digest (``ld1``, else SHA-256) with its
    dtype and shape; two leaves with one key hold the same values. None for a string leaf or a
    leaf recorded without a digest."""
    ld1 = d.ld1 if d.ld1 is None or d.ld1.startswith("ld1:") else f"ld1:{d.ld1}"
    value = ld1 if ld1 else (f"sha256:{d.digest}" if d.digest else None)
    if value is None or d.dtype == "string":
        return None
    return f"{value} {d.dtype}{list(d.shape)}"


def recorded_values(item: Location) -> dict[str, str]:
    """Leaf -> ``values_key`` of each array leaf the item's record holds: none when it has no
    record, or a damaged one (``verify`` reports that)."""
    try:
        record = read_digests(item)
    except CkptError:
        return {}
    if record is None:
        return {}
    keys = {name: values_key(d) for name, d in record.leaves.items()}
    return {name: key for name, key in keys.items() if key is not None}


def same_values(recorded: LeafDigest, got: LeafDigest) -> bool:
    """Whether ``got`` agrees with every digest ``recorded`` holds that ``got`` has too."""
    pairs = [(recorded.digest, got.digest), (recorded.ld1, got.ld1)]
    return all(r == g for r, g in pairs if r is not None and g is not None)


class ValueHasher:
    """SHA-256 over a leaf's C-order little-endian bytes, fed C-order blocks in order."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, block: Any) -> None:
        import numpy as np

        x = np.ascontiguousarray(block)
        big = x.dtype.byteorder == ">" or (x.dtype.byteorder == "=" and sys.byteorder == "big")
        if big and x.dtype.itemsize > 1:
            x = x.byteswap()
        self._h.update(x.reshape(-1).view(np.uint8).data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def c_order_block(info: ArrayInfo, budget: int, row_cap: int = CHUNK_ROW_CAP) -> tuple[int, ...]:
    """A block whose consecutive positions are consecutive ranges of the C-order stream.

    Dims before the split dim ``k`` are 1, dim ``k`` takes ``r`` indices, later dims are whole.
    ``k`` is the first dim whose trailing sub-array fits ``budget``; ``r`` is whole chunks along
    ``k`` (at least one chunk-row when that fits ``row_cap``), so chunks are decoded once.
    """
    shape, chunk = info.shape, info.chunk_shape
    if not shape:
        return ()
    item = info.itemsize
    k = len(shape) - 1
    for d in range(len(shape)):
        if math.prod(shape[d + 1 :]) * item <= budget:
            k = d
            break
    inner = math.prod(shape[k + 1 :]) * item
    r = max(1, budget // max(1, inner))
    c = max(1, chunk[k])
    if r >= c:
        r = r // c * c
    elif c * inner <= row_cap:
        r = c
    r = max(1, min(r, shape[k]))
    return (1,) * k + (r,) + tuple(shape[k + 1 :])


def c_range(
    start: tuple[int, ...], box: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[int, int] | None:
    """The (first element, element count) of a box that is one range of the C-order stream
    (leading dims 1, then one partial dim, then whole dims), None for any other box."""
    dims = [d for d, n in enumerate(box) if n != 1]
    j = dims[0] if dims else len(box)
    whole = all(start[d] == 0 and box[d] == shape[d] for d in range(j + 1, len(box)))
    if not whole:
        return None
    offset = 0
    for s, n in zip(start, shape, strict=True):
        offset = offset * n + s
    return offset, math.prod(box)


class _OrderedHasher:
    """SHA-256 of a leaf fed blocks in write order: exact only while every block is the next
    range of the C-order stream; ``hexdigest`` is None once one is not (order lost)."""

    def __init__(self) -> None:
        self.hasher: ValueHasher | None = ValueHasher()
        self.next = 0

    def add(self, start: tuple[int, ...], block: Any, shape: tuple[int, ...]) -> None:
        span = c_range(start, tuple(block.shape), shape)
        if self.hasher is None or span is None or span[0] != self.next:
            self.hasher = None
            return
        self.hasher.update(block)
        self.next += span[1]

    def hexdigest(self, shape: tuple[int, ...]) -> str | None:
        if self.hasher is None or self.next != math.prod(shape):
            return None
        return self.hasher.hexdigest()


#: The largest block whose partial ``BlockDigests.add(later=True)`` takes on one pool thread.
LATER_MAX_BYTES = 64 << 20


class BlockDigests:
    """Verify while writing: the ``ld1`` of the blocks a writer is about to write, for the
    leaves or tensors with an expected (carried) digest; ``check`` compares them.

    ``collect``: more leaves to take the ``ld1`` partials of without a digest to compare (a
    worker's share of a leaf: its driver merges and compares). ``sha256``: leaves to take the
    SHA-256 of (a version-1 record), the expected hex or None (collect only); a leaf whose
    blocks are not written in C order (output chunks that split rows, or a leaf spread over
    several units) gets none and stays unchecked (``unchecked``)."""

    def __init__(
        self,
        expect: Mapping[str, str],
        collect: Iterable[str] = (),
        sha256: Mapping[str, str | None] | None = None,
    ) -> None:
        self.expect = dict(expect)
        self.collect = set(collect) | set(self.expect)
        self.partials: dict[str, Partial] = {}
        self.sha256 = dict(sha256 or {})
        self.hashers = {name: _OrderedHasher() for name in self.sha256}
        self.hashes: dict[str, str | None] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}

    def restrict(self, names: set[str]) -> BlockDigests:
        """The same digests for the leaves in ``names`` only (those actually written)."""
        sha = {k: v for k, v in self.sha256.items() if k in names}
        out = BlockDigests({k: v for k, v in self.expect.items() if k in names}, (), sha)
        out.collect = {k for k in self.collect if k in names}
        return out

    def add(
        self,
        name: str,
        start: tuple[int, ...],
        block: Any,
        shape: tuple[int, ...],
        dtype: str | None = None,
        later: bool = False,
    ) -> Callable[[], None] | None:
        """Take the ``ld1`` partial of a block about to be written (and feed the SHA-256 in
        write order). ``later``: the partial is taken on the hashing pool while the caller
        goes on; returns what absorbs it (waiting for it: call before ``block`` is reused),
        or None when there is nothing to absorb. A block over ``LATER_MAX_BYTES`` is hashed
        now, in parts on the pool at once (one thread alone would take it long after its
        write)."""
        if name in self.hashers:
            self.hashers[name].add(start, block, shape)
            self.shapes[name] = shape
        if name not in self.collect:
            return None
        if later and getattr(block, "nbytes", 0) <= LATER_MAX_BYTES:
            from ckpt_cli.core.digest.ld1 import partial
            from ckpt_cli.core.threads import hash_pool

            fut = hash_pool().submit(partial, start, block, shape, dtype)
            return lambda: self.absorb(name, fut.result())
        from ckpt_cli.core.digest.ld1_threads import partial_threaded

        self.absorb(name, partial_threaded(start, block, shape, dtype))
        return None

    def absorb(self, name: str, box: Partial) -> None:
        """Merge a partial taken elsewhere (a worker's) into ``name``'s."""
        from ckpt_cli.core.digest.ld1 import merge

        prev = self.partials.get(name)
        self.partials[name] = box if prev is None else merge([prev, box])

    def sha256_found(self) -> dict[str, str | None]:
        """Leaf -> the SHA-256 of its values written in C order (None: not in C order)."""
        found = {k: h.hexdigest(self.shapes.get(k, ())) for k, h in self.hashers.items()}
        return found | self.hashes

    @property
    def unchecked(self) -> list[str]:
        """Leaves with a version-1 digest that could not be checked (not written in C order)."""
        found = self.sha256_found()
        return sorted(k for k, v in self.sha256.items() if v and found.get(k) is None)

    def check(self, noun: str = "leaf", what: str = "written") -> None:
        """Raise ``SourceDigestError`` for the first one whose blocks' digest differs."""
        from ckpt_cli.core.digest.ld1 import finish

        for name, want in sorted(self.expect.items()):
            p = self.partials.get(name)
            found = finish(p) if p is not None else None
            if found != want:
                _mismatch(noun, name, "ld1", found, want, what)
        found_sha = self.sha256_found()
        for name, want_sha in sorted(self.sha256.items()):
            got = found_sha.get(name)
            if want_sha and got is not None and got != want_sha:
                _mismatch(noun, name, "SHA-256", got, want_sha, what)


def _mismatch(noun: str, name: str, algo: str, found: str | None, want: str, what: str) -> None:
    raise SourceDigestError(
        f"{noun} {name!r}: the values read have {algo} {found}, the recorded digest "
        f"is {want}: the source is damaged; nothing was {what}",
        hint="run `ckpt verify --deep` on the source and restore it from a copy",
    )
