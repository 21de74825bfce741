"""Stream leaves block by block with several TensorStore reads in flight.

The engine under ``verify --deep`` and ``--sample``: it decodes every requested block, counts
NaN and Inf, and feeds the C-order digest. Reads are TensorStore futures (decoding runs on its
thread pool), at most ``IN_FLIGHT`` blocks and ``IN_FLIGHT_BYTES`` at a time across leaves, so
many small leaves overlap as well as the blocks of one large leaf, and memory stays flat in the
checkpoint's size. Blocks are consumed in submission order, which keeps each digest in C order.
Where no SHA-256 needs the values in order, a job on the scan's pool waits for each block and
counts and hashes it into an ``Acc`` of its own, which the leaf's absorbs in that order: the
counting runs on every thread, not on the one that takes the blocks.

A leaf whose chunks are at least the budget and stream here (``chunkstream``: range reads,
zstd decoded as a stream, a slab at a time) is read by jobs on a pool of ``threads()`` threads:
a job reads, decodes, counts and hashes its part slab by slab (its ``ld1`` in parts on the
hashing pool, ``digest/ld1_threads.py``), so as many such chunks as threads stream at once (a
checkpoint saved from one device is only such leaves). A job is one chunk, each with its own
``scan_acc.Acc`` that the leaf's takes when it is done, or the whole leaf where it is one chunk
or a SHA-256 needs its values in order. A job holds a slab and a read range only while
it runs (and ``ld1``'s scratch, at most twice the slab), and the pool runs ``threads()`` at
once: ``threads() x 4 x budget`` (16 MiB a thread at verify's 4 MiB), beside the TensorStore reads in flight (``2 x threads()`` blocks, at most
``max(IN_FLIGHT_BYTES, 2 x threads() x budget)``). Jobs queued or done hold nothing, so they
count in the reads in flight but not in their bytes.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from ckpt_cli.core.digest.ld1 import finish
from ckpt_cli.core.digest.records import c_order_block
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, LeafReader
from ckpt_cli.core.format.blocks import (
    cache_bytes,
    is_large,
    iter_blocks,
    stream_blocks,
    streams,
)
from ckpt_cli.core.format.chunkread import Place, chunk_layout
from ckpt_cli.core.format.chunkstream import chunk_slabs
from ckpt_cli.core.format.scan_acc import Acc, Block, LeafScan, ScanTask
from ckpt_cli.core.threads import threads
from ckpt_cli.errors import CkptError, StorageError, first_line

#: Block budget of verify's reads: small blocks keep memory flat whatever the leaf sizes; TS
#: still decodes the chunks of one block in parallel. (Chunk-rows may exceed it: digests.py.)
SCAN_BLOCK_BYTES = 4 << 20
IN_FLIGHT = 8
IN_FLIGHT_BYTES = 32 << 20
OPEN_AHEAD = 8
OPEN_CACHE_BYTES = 16 << 20

#: Where a leaf's chunk (leaf name, chunk key) lies in a local file, when the caller knows.
Locate = Callable[[str, str], Place | None]


def ld1_of(scan: LeafScan) -> str | None:
    """The leaf's ``ld1`` when the scan's partial covers all of it (else None)."""
    p = scan.partial
    if p is None or scan.error is not None or p.covered != p.nbytes:
        return None
    return finish(p)


class _Assembled:
    """A block gathered from per-chunk reads, for readers that cannot read across chunks."""

    def __init__(self, shape: tuple[int, ...], parts: list[tuple[Block, Any]]) -> None:
        self.shape = shape
        self.parts = parts

    def result(self) -> Any:
        import numpy as np

        out = None
        for local, fut in self.parts:
            piece = np.asarray(fut.result())
            if out is None:
                out = np.empty(self.shape, piece.dtype)
            out[local] = piece
        return out


def read_block(reader: LeafReader, block: Block) -> Any:
    """A future for any block of a leaf, whatever the reader supports."""
    if reader.multi_chunk_blocks:
        return reader.read(block)
    chunk = reader.info.chunk_shape
    ranges = []
    for sl, c in zip(block, chunk, strict=True):
        cuts, a = [], sl.start
        while a < sl.stop:
            b = min(sl.stop, (a // c + 1) * c) if c else sl.stop
            cuts.append((a, b))
            a = b
        ranges.append(cuts)
    parts = []
    for combo in itertools.product(*ranges):
        sub = tuple(slice(a, b) for a, b in combo)
        local = tuple(
            slice(a - sl.start, b - sl.start) for (a, b), sl in zip(combo, block, strict=True)
        )
        parts.append((local, reader.read(sub)))
    return _Assembled(tuple(sl.stop - sl.start for sl in block), parts)


def _blocks(task: ScanTask, reader: LeafReader, budget: int) -> Iterable[Block]:
    if task.blocks is not None:
        return task.blocks
    if task.digest:
        return iter_blocks(task.info, c_order_block(task.info, budget))
    if reader.multi_chunk_blocks:
        # Whole chunks merged under the budget, or a chunk larger than it in slabs (decoded
        # once, served from the readers' chunk cache): progress moves slab by slab.
        return stream_blocks(task.info, budget)
    return iter_blocks(task.info, task.info.chunk_shape)


def open_readers(
    store: ItemStore, tasks: Iterable[ScanTask], cache: int = 0
) -> Iterator[tuple[ScanTask, LeafReader | CkptError]]:
    """Readers in task order, opened ``OPEN_AHEAD`` leaves ahead in one shared context.

    A ``ts.open`` per leaf in its own context re-reads the OCDBT manifest and tree nodes each
    time; a shared context with a small cache pool reads them once, and opening ahead keeps the
    reads of many small leaves flowing.
    """
    if store.layout != "zarr" and store.layout != "ocdbt":
        for task in tasks:  # per-process databases: the store assembles its own reader
            try:
                yield task, store.reader(task.name, task.info, task.database)
            except CkptError as e:
                yield task, e
        return
    import tensorstore as ts

    from ckpt_cli.core.threads import ts_context

    limit = max(OPEN_CACHE_BYTES, cache)
    context = ts_context(cache_pool={"total_bytes_limit": limit})
    ahead: deque[tuple[ScanTask, Any]] = deque()
    queue = iter(tasks)
    while True:
        while len(ahead) < OPEN_AHEAD and (nxt := next(queue, None)) is not None:
            spec = store.array_spec(nxt.name, nxt.database)
            ahead.append((nxt, ts.open(spec, open=True, read=True, context=context)))
        if not ahead:
            return
        task, fut = ahead.popleft()
        try:
            yield task, LeafReader(fut.result(), task.info)
        except Exception as e:
            yield task, StorageError(f"cannot open leaf {task.name!r}: {str(e).splitlines()[0]}")


def scan_leaves(
    store: ItemStore,
    tasks: Iterable[ScanTask],
    budget: int = SCAN_BLOCK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    locate: Locate | None = None,
) -> Iterator[LeafScan]:
    """Read the tasks' blocks with bounded concurrency; yield each leaf once it is done.
    ``locate``: where streamed chunks lie in local files (``chunkstream.FileValue``).

    ``stop(bytes_in_flight)`` is asked before every read (``verify --max-duration``): once it
    says so, no read is submitted any more, the reads in flight finish, and the leaf it stopped
    in is yielded incomplete (``next_block``); later tasks are not read at all.
    """
    from concurrent.futures import ThreadPoolExecutor

    n = threads()
    # Two blocks (or streaming jobs) per thread, at least the old window.
    flight = _InFlight(on_bytes, max(IN_FLIGHT, 2 * n), max(IN_FLIGHT_BYTES, 2 * n * budget))
    tasks = list(tasks)
    cache = cache_bytes((t.info for t in tasks if t.blocks is None), budget)
    with ThreadPoolExecutor(n, thread_name_prefix="ckpt-stream") as pool:
        try:
            for task, reader in open_readers(store, tasks, cache):
                acc = Acc(task)
                if isinstance(reader, CkptError):
                    acc.error = reader.message
                    flight.end_leaf(acc)
                    yield from flight.drain(flight.count, flight.limit)
                    continue
                where = functools.partial(locate, task.name) if locate else None
                stopped = yield from _read_task(
                    task, reader, budget, acc, flight, stop, pool, where
                )
                flight.end_leaf(acc)
                if stopped:
                    break
            yield from flight.drain(0, -1)
        finally:
            flight.cancel()


def _count_block(acc: Acc, fut: Any, origin: tuple[int, ...], nbytes: int) -> None:
    """Wait for one block TensorStore reads (or take its error) and count it into ``acc``."""
    try:
        if isinstance(fut, BaseException):
            raise fut
        acc.add(fut.result(), origin)
        acc.bytes += nbytes
        acc.blocks += 1
    except Exception as e:
        acc.error = first_line(e)


class _InFlight:
    """The reads submitted and not yet taken, in submission order; a leaf's end is an entry
    without a future."""

    def __init__(
        self, on_bytes: Callable[[int], None] | None, count: int = IN_FLIGHT, limit: int = 0
    ) -> None:
        self.pending: deque[tuple[Acc, Any, int, tuple[int, ...]]] = deque()
        self.bytes = 0
        self.on_bytes = on_bytes
        #: Reads (and streaming jobs) in flight at most, and their bytes.
        self.count, self.limit = count, limit or IN_FLIGHT_BYTES
        self.stopping = False  # the scan was abandoned: streaming jobs end at their next slab

    def cancel(self) -> None:
        self.stopping = True

    def submit(self, acc: Acc, fut: Any, nbytes: int, origin: tuple[int, ...] = ()) -> None:
        self.pending.append((acc, fut, nbytes, origin))
        self.bytes += nbytes

    def end_leaf(self, acc: Acc) -> None:
        self.pending.append((acc, None, 0, ()))

    def _take(self) -> LeafScan | None:
        acc, fut, nbytes, origin = self.pending.popleft()
        if fut is None:
            return acc.result()
        self.bytes -= nbytes
        if isinstance(fut, _Streaming):
            fut.future.result()  # the job counted, hashed and reported its slabs itself
            if fut.part is not acc:
                acc.absorb(fut.part)
            return None
        if acc.error is None:
            _count_block(acc, fut, origin, nbytes)
        if self.on_bytes is not None:
            self.on_bytes(nbytes)
        return None

    def drain(self, limit_count: int, limit_bytes: int) -> Iterator[LeafScan]:
        """Take reads until no more than ``limit_count`` reads and ``limit_bytes`` are pending;
        yield the leaves that completes."""
        while self.pending and (len(self.pending) > limit_count or self.bytes > limit_bytes):
            done = self._take()
            if done is not None:
                yield done


class _Done:
    """A read that already happened (a slab streamed here), in place of a TensorStore future."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value


def streamed_slabs(
    info: ArrayInfo,
    reader: LeafReader | CkptError,
    budget: int,
    c_order: bool = False,
    locate: Callable[[str], Place | None] | None = None,
    at_budget: bool = False,
) -> Iterator[tuple[Any, Any]] | None:
    """(origin, values) of a leaf whose chunks exceed ``budget`` (or fill it, ``at_budget``:
    the scan, ``blocks.streams``) and can be streamed here (``chunkstream``), in C order when
    ``c_order`` (a digest); None: read through TensorStore. A caller that streams on one thread
    (``diff``) leaves chunks of exactly the budget to TensorStore's parallel reads."""
    slabs = _chunk_streams(info, reader, budget, c_order, locate, at_budget)
    return None if slabs is None else slabs()


def _chunk_streams(
    info: ArrayInfo,
    reader: LeafReader | CkptError,
    budget: int,
    c_order: bool,
    locate: Callable[[str], Place | None] | None,
    at_budget: bool,
) -> Callable[..., Iterator[tuple[Any, Any]]] | None:
    """``chunk_slabs`` of the leaf bound to its store (call it with ``chunks=`` for some of
    them), or None where ``streamed_slabs`` says None."""
    large = streams(info, budget) if at_budget else is_large(info, budget)
    if type(reader) is not LeafReader or not large:
        return None
    if c_order and any(g > 1 for g in info.chunk_grid[1:]):
        return None  # chunk after chunk would not be the leaf's C order
    try:
        layout = chunk_layout(reader.array.spec().to_json()["metadata"], info)
        kv = reader.array.kvstore
    except Exception:
        return None
    if layout is None or kv is None:
        return None
    dtype = reader.array.dtype.numpy_dtype
    return functools.partial(chunk_slabs, kv, layout, info, dtype, budget, locate)


def chunk_start(info: ArrayInfo, index: tuple[int, ...]) -> int | None:
    """The byte where chunk ``index`` begins in the leaf's C-order stream when the chunk is one
    run of it (every axis but the first whole) starting at a word's first byte; else None."""
    if any(g > 1 for g in info.chunk_grid[1:]):
        return None
    start = index[0] * info.chunk_shape[0] * math.prod(info.shape[1:]) * info.itemsize
    return None if start % 8 else start


def _stream_jobs(
    task: ScanTask,
    reader: LeafReader,
    budget: int,
    acc: Acc,
    locate: Callable[[str], Place | None] | None,
) -> list[tuple[Acc, Iterator[tuple[Any, Any]]]] | None:
    """The jobs that stream a leaf (each its ``Acc`` and slabs), or None (not streamed here).
    One job when the leaf is one chunk or a SHA-256 needs its values in order; otherwise a job
    a chunk, each with its own ``Acc`` (the leaf's takes them: ``Acc.absorb``), so the chunks
    of one large leaf decode on every thread, not one after another on one."""
    slabs = _chunk_streams(task.info, reader, budget, task.digest, locate, at_budget=True)
    if slabs is None:
        return None
    if task.digest or math.prod(task.info.chunk_grid) == 1:
        return [(acc, slabs())]
    return [
        (Acc(task, chunk_start(task.info, index)), slabs(chunks=(index,)))
        for index in itertools.product(*(range(g) for g in task.info.chunk_grid))
    ]


class _Streaming:
    """A streamed leaf, or one chunk of it, read by a job on the scan's pool (``part``, its
    ``Acc``, filled there: the leaf's own, or one the leaf's absorbs once the job is done)."""

    def __init__(self, future: Any, part: Acc) -> None:
        self.future = future
        self.part = part


def _stream_leaf(acc: Acc, slabs: Iterator[tuple[Any, Any]], flight: _InFlight) -> None:
    """Read, decode, count and hash a streamed leaf, or one chunk of it, slab by slab (runs on
    the scan's pool; ``acc`` is touched by this job only until the scan takes it)."""
    try:
        for origin, values in slabs:
            if flight.stopping:
                acc.error = "the scan was stopped"
                return
            acc.add(values, origin)
            acc.bytes += values.nbytes
            acc.blocks += 1
            if flight.on_bytes is not None:
                flight.on_bytes(values.nbytes)
    except Exception as e:
        acc.error = first_line(e)


def _take_block(
    part: Acc, fut: Any, origin: tuple[int, ...], nbytes: int, flight: _InFlight
) -> None:
    """Wait for one block TensorStore reads, then count and hash it into ``part`` (runs on
    the scan's pool, so the blocks of many leaves are counted on every thread, not in turn on
    the one that takes them; the leaf's ``Acc`` absorbs ``part`` in submission order)."""
    _count_block(part, fut, origin, nbytes)
    if flight.on_bytes is not None:
        flight.on_bytes(nbytes)


_Read = tuple[Callable[[], Any], tuple[int, ...], int]


def _reads(task: ScanTask, reader: LeafReader, budget: int, whole: bool) -> Iterator[_Read]:
    """(submit the read, block origin, bytes) of every block of the task, in order. A chunk
    of the budget or more is streamed only in a ``whole`` pass of the leaf: a budgeted run
    (``--max-duration``, ``--rotate``) counts its cursor in the leaf's blocks, not in slabs."""
    streamed = None
    if task.blocks is None and whole:
        streamed = streamed_slabs(task.info, reader, budget, task.digest, at_budget=True)
    if streamed is not None:
        try:
            for origin, values in streamed:
                yield functools.partial(_Done, values), origin, values.nbytes
        except Exception as e:
            yield functools.partial(_Done, e), (), 0
        return
    for sl in _blocks(task, reader, budget):
        nbytes = math.prod(s.stop - s.start for s in sl) * task.info.itemsize
        yield functools.partial(_submit, reader, sl), tuple(s.start for s in sl), nbytes


def _submit(reader: LeafReader, sl: Block) -> Any:
    try:
        return read_block(reader, sl)
    except Exception as e:
        return e


def _read_task(
    task: ScanTask,
    reader: LeafReader,
    budget: int,
    acc: Acc,
    flight: _InFlight,
    stop: Callable[[int], bool] | None,
    pool: Any = None,
    locate: Callable[[str], Place | None] | None = None,
) -> Generator[LeafScan, None, bool]:
    """Submit the reads of one task's blocks, yielding the leaves completed meanwhile; returns
    whether ``stop`` ended the scan. A leaf streamed here whole is jobs on ``pool``
    (``_stream_jobs``)."""
    whole = stop is None and task.start == 0 and task.stop is None
    if pool is not None and whole and task.blocks is None:
        jobs = _stream_jobs(task, reader, budget, acc, locate)
        if jobs is not None:
            for part, slabs in jobs:
                job = _Streaming(pool.submit(_stream_leaf, part, slabs, flight), part)
                flight.submit(acc, job, 0)  # its memory is the pool's: the module's docstring
                yield from flight.drain(flight.count, flight.limit)
            return False
    for index, (read, origin, nbytes) in enumerate(_reads(task, reader, budget, whole)):
        if index < task.start:
            continue
        if (task.stop is not None and index >= task.stop) or acc.error is not None:
            break
        if stop is not None and stop(flight.bytes):
            acc.next_block = index
            return True
        fut = read()
        if pool is not None and not task.digest and not isinstance(fut, _Done):
            part = Acc(task, None)  # counted and hashed on the pool: ``_take_block``
            fut = _Streaming(pool.submit(_take_block, part, fut, origin, nbytes, flight), part)
        flight.submit(acc, fut, nbytes, origin)
        # A streamed slab is decoded already: holding it would only hold memory.
        done = isinstance(fut, _Done)
        yield from flight.drain(0 if done else flight.count, 0 if done else flight.limit)
    return False
