"""The data levels of ``verify``: ``--deep`` (every chunk), ``--sample`` (a random subset of
chunks) and the digests they check or record.

Decoding runs through ``scan.scan_leaves`` (TensorStore futures, bounded in flight). The file
checksum pass reads raw files on a thread pool at the same time (half of ``--threads``, at
least 2): ``crc.crc32`` and file reads release the GIL, so the two overlap instead of adding
up. A file larger than ``RANGE_BYTES`` is checksummed in byte ranges on that pool, joined with
``crc32_combine`` (``crc``): one large data file no longer takes one thread alone. A local
OCDBT data file that is mostly chunks streamed from it (``_tapped_files``) is not read twice:
the decoder's reads are summed as they land (``filesums.ReadTaps``) and only the bytes it did
not read are read after the scan (``_tapped_sums``).
"""

from __future__ import annotations

import itertools
import math
import random
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from ckpt_cli.core.digest.records import (
    DIGEST_FILE,
    FileSum,
    LeafDigest,
    Wanted,
    file_checksum,
    recorded_file,
    same_values,
)
from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.scan import SCAN_BLOCK_BYTES, ld1_of, scan_leaves
from ckpt_cli.core.format.scan_acc import LeafScan, ScanTask
from ckpt_cli.core.verify.budget import chunk_key, subset_of
from ckpt_cli.core.verify.gate import chunk_locator, local_ocdbt
from ckpt_cli.core.verify.types import DataResult, ItemFacts, NonFinite, SampleInfo, SampleSpec
from ckpt_cli.errors import CkptError

if TYPE_CHECKING:
    from ckpt_cli.core.digest.filesums import Piece, ReadTaps

_FILE_WORKERS = 2
_REMOTE_FILE_WORKERS = 4
#: A file above this is checksummed in ranges of it, on several threads.
RANGE_BYTES = 32 << 20
_RESTORE = "restore this step from a copy"


class _Bytes:
    """A thread-safe byte counter in front of the caller's progress callback."""

    def __init__(self, on_bytes: Callable[[int], None] | None) -> None:
        self.on_bytes = on_bytes
        self.lock = threading.Lock()

    def __call__(self, n: int) -> None:
        if self.on_bytes is not None:
            with self.lock:
                self.on_bytes(n)


def deep_item(
    facts: ItemFacts,
    want_digests: Wanted,
    budget: int = SCAN_BLOCK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    start: tuple[int, int] | None = None,
) -> DataResult:
    """Decode every chunk of every readable array; digests and file checksums when wanted.

    Budgeted (``verify --max-duration``): ``stop(bytes_in_flight)`` ends the reads early, and
    ``start`` = (leaf index in name order, block index) resumes a rotation there;
    ``resume_at`` in the result says where the next run goes on (None: the item's end was
    reached). A leaf's digest is checked only when this run read it whole; recorded files are
    checksummed one by one while the budget lasts.
    """
    progress = _Bytes(on_bytes)
    files = _data_files(facts) if want_digests else []
    result = DataResult([], {}, {})
    names = sorted(facts.arrays)
    first_leaf, first_block = start or (0, 0)
    taps, tapped = _taps(facts, files, budget, want_digests.sha256, stop is None and not start)
    with ThreadPoolExecutor(_file_workers(facts)) as pool:
        rest = [rel for rel in files if rel not in tapped]
        sums = [] if stop else _submit_sums(pool, facts, rest, progress)
        tasks = [
            _task(facts, name, want_digests, budget, first_block if i == first_leaf else 0)
            for i, name in enumerate(names)
            if i >= first_leaf
        ]
        if facts.store is not None:
            for scan in scan_leaves(
                facts.store, tasks, budget, progress, stop, chunk_locator(facts, taps)
            ):
                _take_scan(facts, result, scan, facts.arrays[scan.name][0])
                if scan.complete and scan.error is None:
                    result.leaves_complete += 1
                    result.chunks_decoded += _stored_count(facts, scan.name)
                elif not scan.complete and scan.next_block is not None:
                    result.resume_at = (names.index(scan.name), scan.next_block)
        if stop is not None:
            sums = [(rel, _done(_checksum(facts, rel, progress))) for rel in files if not stop(0)]
        if taps is not None:
            sums += _tapped_sums(pool, facts, taps, sorted(tapped), progress)
        _take_sums(facts, result, sorted(sums, key=lambda s: s[0]))
    for name, value in facts.strings.items():
        from ckpt_cli.core.digest.records import string_digest

        result.digests[name] = string_digest(value)
    return result


def _task(facts: ItemFacts, name: str, want: Wanted, budget: int, start: int) -> ScanTask:
    """The scan of one leaf: all of it, or of a local tier's partial leaf the chunks stored
    (each in slabs under ``budget``), with no digest (a digest is of a whole leaf)."""
    info, label = facts.arrays[name]
    present = facts.partial.get(name)
    if present is None:
        return ScanTask(name, info, label, digest=want.sha256, ld1=want.ld1, start=start)
    from ckpt_cli.core.format.blocks import region_slabs

    blocks = tuple(
        slab
        for index in sorted(present)
        for slab in region_slabs(info.chunk_box(index), info.itemsize, budget)
    )
    return ScanTask(name, info, label, blocks=blocks, start=start)


def _stored_count(facts: ItemFacts, name: str) -> int:
    """Chunks of a leaf stored: all of its grid, or a partial leaf's stored ones."""
    present = facts.partial.get(name)
    return facts.arrays[name][0].num_chunks if present is None else len(present)


def _file_workers(facts: ItemFacts) -> int:
    """Files (or ranges) checksummed at once: half the threads, at least 2, on local disks
    (they overlap with the decoding); on object stores at least 4, each with its own ranged
    reads in flight (``iter_bytes``)."""
    from ckpt_cli.core.threads import threads

    base = facts.inventory.base if facts.inventory else None
    if base is None or base.parallel_reads <= 1:
        return max(_FILE_WORKERS, threads() // 2)
    return max(_REMOTE_FILE_WORKERS, threads())


class _Sum(Protocol):
    def result(self) -> FileSum | str: ...


class _Joined:
    """The CRC-32 of a file checksummed in ranges: its pieces joined once all are done
    (``ready``: pieces summed already, as the decoder read them)."""

    def __init__(self, pieces: list[Future[Piece]], ready: list[Piece] | None = None) -> None:
        self.pieces = pieces
        self.ready = ready or []

    def result(self) -> FileSum | str:
        from ckpt_cli.core.digest.filesums import join_ranges

        return join_ranges([*self.ready, *(f.result() for f in self.pieces)])[0][1]


def _taps(
    facts: ItemFacts, files: list[str], budget: int, sha256: bool, whole: bool
) -> tuple[ReadTaps | None, set[str]]:
    """Where the decoder's reads are summed (a whole pass of a local OCDBT item whose files
    are wanted), and the files summed from them (``_tapped_files``)."""
    from ckpt_cli.core.digest.filesums import ReadTaps

    if not (whole and files and local_ocdbt(facts)):
        return None, set()
    return ReadTaps(), _tapped_files(facts, budget, sha256) & set(files)


def _tapped_files(facts: ItemFacts, budget: int, sha256: bool) -> set[str]:
    """Data files whose bytes are mostly chunks the scan streams from the file itself
    (``chunk_locator``): their CRC-32s are summed from the decoder's reads (``ReadTaps``) and
    the bytes it did not read, after the scan. The others are read and summed beside it."""
    from ckpt_cli.core.format.blocks import streams

    streamed = {
        name.encode()
        for name, (info, _) in facts.arrays.items()
        if streams(info, budget) and not (sha256 and any(g > 1 for g in info.chunk_grid[1:]))
    }
    read: dict[str, int] = {}
    for key, ref in facts.keys.items():
        if ref is not None and key.split(b"/", 1)[0] in streamed:
            read[ref.file] = read.get(ref.file, 0) + ref.length
    assert facts.inventory is not None
    sizes = facts.inventory.sizes
    return {rel for rel, n in read.items() if 0 < (sizes.get(rel) or 0) <= 2 * n}


def _tapped_sums(
    pool: ThreadPoolExecutor,
    facts: ItemFacts,
    taps: ReadTaps,
    files: list[str],
    progress: _Bytes,
) -> list[tuple[str, _Sum]]:
    """Each tapped file's CRC-32: the ranges the decoder read, joined with the rest read now
    (in ``RANGE_BYTES`` ranges on ``pool``)."""
    assert facts.inventory is not None
    out: list[tuple[str, _Sum]] = []
    for rel in files:
        pieces, gaps = taps.pieces(rel, facts.inventory.sizes.get(rel) or 0)
        progress(sum(p[2] for p in pieces))
        futures = [
            pool.submit(_range_sum, facts, rel, a, min(end, a + RANGE_BYTES), progress)
            for _, start, end in gaps
            for a in range(start, end, RANGE_BYTES)
        ]
        out.append((rel, _Joined(futures, pieces)))
    return out


def _submit_sums(
    pool: ThreadPoolExecutor, facts: ItemFacts, files: list[str], progress: _Bytes
) -> list[tuple[str, _Sum]]:
    """A checksum per file on ``pool``; a file larger than ``RANGE_BYTES`` in ranges of it."""
    assert facts.inventory is not None
    out: list[tuple[str, _Sum]] = []
    for rel in files:
        size = facts.inventory.sizes.get(rel) or 0
        if size <= RANGE_BYTES:
            out.append((rel, pool.submit(_checksum, facts, rel, progress)))
            continue
        cuts = range(0, size, RANGE_BYTES)
        pieces = [
            pool.submit(_range_sum, facts, rel, a, min(size, a + RANGE_BYTES), progress)
            for a in cuts
        ]
        out.append((rel, _Joined(pieces)))
    return out


def _range_sum(facts: ItemFacts, rel: str, start: int, end: int, progress: _Bytes) -> Piece:
    from ckpt_cli.core.digest.filesums import range_checksum

    assert facts.inventory is not None
    piece = range_checksum(facts.inventory.base, rel, start, end)
    if not isinstance(piece[3], str):
        progress(piece[2])
    return piece


def _checksum(facts: ItemFacts, rel: str, progress: _Bytes) -> FileSum | str:
    assert facts.inventory is not None
    try:
        got = file_checksum(facts.inventory.base.child(*rel.split("/")))
    except CkptError as e:
        return e.message
    progress(got.size)
    return got


def _data_files(facts: ItemFacts) -> list[str]:
    assert facts.inventory is not None
    return sorted(
        rel
        for rel, size in facts.inventory.sizes.items()
        if size is not None and recorded_file(rel)
    )


def _take_scan(facts: ItemFacts, result: DataResult, scan: LeafScan, info: ArrayInfo) -> None:
    result.bytes_decoded += scan.bytes
    if scan.error is not None:
        facts.add(
            "decode-error",
            f"{scan.name}: a chunk cannot be read or decoded ({scan.error}); {_RESTORE}",
            leaf=scan.name,
        )
        return
    if scan.nan or scan.inf:
        result.nonfinite.append(NonFinite(scan.name, scan.nan, scan.inf))
        facts.add(
            "nonfinite",
            f"{scan.name} holds {scan.nan} NaN and {scan.inf} Inf of {info.size} values: the "
            "run had diverged when this step was saved; resume from an earlier step",
            leaf=scan.name,
        )
    # The record says how many NaN/Inf the leaf holds (prune, trend read it without a pass).
    got = LeafDigest(info.dtype, info.shape, scan.digest, ld1_of(scan), scan.nan + scan.inf)
    if got.digest is None and got.ld1 is None:
        return
    result.digests[scan.name] = got
    rec = facts.record.leaves.get(scan.name) if facts.record else None
    same_layout = rec is not None and (rec.dtype, rec.shape) == (info.dtype, info.shape)
    if rec is not None and same_layout and not same_values(rec, got):
        facts.add(
            "digest-mismatch",
            f"{scan.name}: the values differ from the digest recorded in {DIGEST_FILE} "
            "although every chunk decodes: silent corruption (Orbax would restore these "
            f"wrong values); {_RESTORE}",
            leaf=scan.name,
        )


def _take_sums(facts: ItemFacts, result: DataResult, sums: list[tuple[str, _Sum]]) -> None:
    recorded = facts.record.files if facts.record else {}
    for rel, fut in sums:
        got = fut.result()
        if isinstance(got, str):
            facts.add("unreadable", f"{got}; check permissions and the file system", file=rel)
            continue
        result.files[rel] = got
        rec = recorded.get(rel)
        if rec is not None and rec.size == got.size and rec.crc32 != got.crc32:
            facts.add(
                "datafile-checksum-mismatch",
                f"{rel}: its bytes changed since digests were recorded (CRC-32 {got.crc32}, "
                f"recorded {rec.crc32}); {_RESTORE}",
                file=rel,
            )


def sample_items(
    items: list[ItemFacts],
    spec: SampleSpec,
    seed: int | None,
    budget: int = SCAN_BLOCK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    names: list[str] | None = None,
) -> tuple[list[DataResult], SampleInfo]:
    """Decode a subset of all chunks of all items, random (a share, seeded) or the n-th of t
    disjoint subsets (``spec.subset``; ``names``: the items' names, which with the leaf and the
    chunk index decide a chunk's subset); check the files that hold them."""
    leaves = [
        (i, name, info, _stored(f.partial.get(name)))
        for i, f in enumerate(items)
        for name, (info, _) in sorted(f.arrays.items())
    ]
    counts = [info.num_chunks if p is None else len(p) for _, _, info, p in leaves]
    total_chunks = sum(counts)
    total_bytes = sum(items[i].array_bytes(name) for i, name, _, _ in leaves)
    if spec.subset is not None:
        chosen = _subset_chunks(leaves, spec.subset, names)
        k = sum(len(v) for v in chosen.values())
        seed = None
    else:
        seed = secrets.randbits(32) if seed is None else seed
        fraction = (
            (spec.percent or 0) / 100
            if spec.percent is not None
            else min(1.0, (spec.bytes or 0) / max(1, total_bytes))
        )
        k = min(total_chunks, math.ceil(total_chunks * fraction)) if total_chunks else 0
        chosen = _random_chunks(leaves, counts, k, seed)
    progress = _Bytes(on_bytes)
    results = [DataResult([], {}, {}) for _ in items]
    sampled_bytes = 0
    for i, facts in enumerate(items):
        tasks: list[ScanTask] = []
        files: set[str] = set()
        for li, idxs in sorted(chosen.items()):
            item_index, name, info, _ = leaves[li]
            if item_index != i:
                continue
            blocks = tuple(_chunk_block(info, idx) for idx in idxs)
            tasks.append(ScanTask(name, info, facts.arrays[name][1], blocks=blocks))
            results[i].chunks_decoded += len(idxs)
            files.update(f for idx in idxs if (f := facts.chunk_file(name, idx)) is not None)
        if facts.store is not None and tasks:
            for scan in scan_leaves(facts.store, tasks, budget, progress):
                _take_scan(facts, results[i], scan, facts.arrays[scan.name][0])
        sampled_bytes += results[i].bytes_decoded
        if facts.record is not None and files:
            with ThreadPoolExecutor(_file_workers(facts)) as pool:
                sums: list[tuple[str, _Sum]] = [
                    (rel, pool.submit(_checksum, facts, rel, _Bytes(None))) for rel in sorted(files)
                ]
                _take_sums(facts, results[i], sums)
    subset = f"{spec.subset[0]}/{spec.subset[1]}" if spec.subset else None
    return results, SampleInfo(seed, k, total_chunks, sampled_bytes, total_bytes, subset)


#: (item index, leaf name, array, the chunks stored of a local tier's partial leaf, else None:
#: every chunk of its grid) in sample order
_Leaves = list[tuple[int, str, ArrayInfo, tuple[tuple[int, ...], ...] | None]]


def _stored(present: frozenset[tuple[int, ...]] | None) -> tuple[tuple[int, ...], ...] | None:
    return None if present is None else tuple(sorted(present))


def _subset_chunks(
    leaves: _Leaves, subset: tuple[int, int], names: list[str] | None
) -> dict[int, list[tuple[int, ...]]]:
    """leaf position -> the chunk indices in the n-th of t disjoint subsets."""
    n, t = subset
    chosen: dict[int, list[tuple[int, ...]]] = {}
    for li, (i, name, info, present) in enumerate(leaves):
        item_name = names[i] if names else ""
        every = itertools.product(*(range(g) for g in info.chunk_grid))
        for index in every if present is None else present:
            if subset_of(chunk_key(item_name, name, index), t) == n:
                chosen.setdefault(li, []).append(index)
    return chosen


def _random_chunks(
    leaves: _Leaves, counts: list[int], k: int, seed: int
) -> dict[int, list[tuple[int, ...]]]:
    """leaf position -> the chunk indices of ``k`` chunks drawn with ``seed`` from all of them."""
    total_chunks = sum(counts)
    picks = sorted(random.Random(seed).sample(range(total_chunks), k))
    chosen: dict[int, list[tuple[int, ...]]] = {}
    start, p = 0, 0
    for li, count in enumerate(counts):
        while p < len(picks) and picks[p] < start + count:
            grid, present = leaves[li][2].chunk_grid, leaves[li][3]
            k = picks[p] - start
            chosen.setdefault(li, []).append(_unravel(k, grid) if present is None else present[k])
            p += 1
        start += count
    return chosen


def _done(value: FileSum | str) -> Future[FileSum | str]:
    fut: Future[FileSum | str] = Future()
    fut.set_result(value)
    return fut


def _unravel(linear: int, grid: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for g in reversed(grid):
        linear, r = divmod(linear, g)
        out.append(r)
    return tuple(reversed(out))


def _chunk_block(info: ArrayInfo, index: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(
        slice(i * c, min((i + 1) * c, s))
        for i, c, s in zip(index, info.chunk_shape, info.shape, strict=True)
    )


def item_bytes(facts: ItemFacts, want_digests: Wanted) -> int:
    """Bytes an item's deep pass reports to progress: arrays, plus files when checksummed."""
    arrays = sum(facts.array_bytes(name) for name in facts.arrays)
    files = facts.inventory.total_bytes if (want_digests and facts.inventory) else 0
    return arrays + files
