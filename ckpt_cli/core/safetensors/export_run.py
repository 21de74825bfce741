"""Run an export plan: blocks of each tensor are computed from the source through TensorStore,
a few in flight under the memory limit while one thread writes finished ones at their offsets,
into the files of a temporary directory renamed to the output when every file is complete.
"""

from __future__ import annotations

import functools
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.digest.records import BlockDigests
from ckpt_cli.core.format.scan import Locate
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.safetensors.export import ExportPlan, ExportPlanJSON, ExportTensor
from ckpt_cli.core.safetensors.export_slabs import (
    SlabJob,
    cast_chain,
    jobs_for,
    slab_bytes,
    tensor_slab,
)
from ckpt_cli.core.safetensors.ld1 import LD1_KEY, encode, expected, fill_headers
from ckpt_cli.core.spec import ops
from ckpt_cli.core.threads import threads
from ckpt_cli.core.write.finite import check_finite
from ckpt_cli.errors import RefusedError


class ExportWrittenJSON(TypedDict):
    path: str
    files: list[str]
    bytes: int
    seconds: float


class ExportJSON(ExportPlanJSON):
    """``ckpt export --json``: the tensors and files planned, and what was written."""

    written: NotRequired[ExportWrittenJSON]


@dataclass(frozen=True)
class ExportResult:
    plan: ExportPlan
    seconds: float
    bytes_written: int

    def to_json(self) -> ExportJSON:
        return {
            **self.plan.to_json(),
            "written": {
                "path": self.plan.out,
                "files": [f.name for f in self.plan.files.files]
                + ([self.plan.files.index_name] if self.plan.files.index_name else []),
                "bytes": self.bytes_written,
                "seconds": round(self.seconds, 3),
            },
        }


def check_output(out: str) -> None:
    """The output must be a new (or empty) local directory: an export never mixes with files
    already there."""
    if "://" in out:
        from ckpt_cli.errors import UnsupportedError

        raise UnsupportedError(
            f"export writes to a local directory, not {out}",
            hint="export locally, then copy the directory to the bucket",
        )
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise RefusedError(
            f"{out} already exists and is not an empty directory; nothing written",
            hint="choose a new output directory, or remove that one first",
        )


def execute(plan: ExportPlan, on_progress: ProgressFn | None = None) -> ExportResult:
    """Write the plan's files into a temporary directory, then rename it to ``plan.out``.
    Progress as ``export`` bytes."""
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.verify.gate import chunk_locator, require_sound_source
    from ckpt_cli.core.write.claim import claim_lock

    report = plan.report
    assert report is not None, "an ExportPlan from plan_export"
    # As reshard and migrate: never a link out of the checkpoint, nor damage, carried over.
    facts = require_sound_source(report.ref)
    parent = os.path.dirname(plan.out) or "."
    undo_dirs = open_location(parent).make_dirs_undoable()
    try:
        # One export per output at a time: a second one is refused at once, naming the first.
        claim = claim_lock(
            open_location(os.path.join(parent, f".{os.path.basename(plan.out)}.ckpt-write.lock")),
            plan.out,
            "export",
        )
        try:
            return _execute(plan, report, parent, on_progress, chunk_locator(facts))
        finally:
            claim.release()
    except BaseException:
        undo_dirs()  # the parents this run made, if left empty
        raise


def _execute(
    plan: ExportPlan,
    report: Any,
    parent: str,
    on_progress: ProgressFn | None,
    locate: Locate | None = None,
) -> ExportResult:
    import contextlib
    import secrets
    import shutil
    import time

    from ckpt_cli.core.format.arrays import ItemStore
    from ckpt_cli.core.safetensors.sink import SafetensorsSink
    from ckpt_cli.errors import StorageError

    memory_limit = plan.memory_limit
    on_bytes = ByteProgress(on_progress, "export", plan.total_bytes)
    check_output(plan.out)
    t0 = time.perf_counter()
    tmp = os.path.join(parent, f".{os.path.basename(plan.out)}.ckpt-tmp-{secrets.token_hex(4)}")
    try:
        os.mkdir(tmp)
    except OSError as e:
        raise StorageError.from_error(f"cannot create {tmp}", e) from None
    try:
        store = ItemStore(
            report.ref.location, report.zarr_format == 3, _context(_cache_bytes(plan))
        )
        ctx = ops.EvalContext(store, {})
        digests = BlockDigests(expected(plan.metadata), [t.name for t in plan.tensors])
        label = None if plan.allow_nonfinite else f"{report.ref.location}"
        stream = _Stream(ctx, memory_limit, on_bytes, digests, locate, label)
        with SafetensorsSink(tmp, plan.files) as sink, contextlib.closing(stream):
            # The writer thread stops (closing) before the sink closes its files (abort).
            by_name = {t.name: t for t in plan.tensors}
            order = [by_name[e.name] for f in plan.files.files for e in f.header.tensors]
            opener = _Opener(store, ctx, order)
            for f in plan.files.files:
                for entry in f.header.tensors:
                    opener.ready(by_name[entry.name])
                    stream.tensor(by_name[entry.name], sink)
                stream.drain(sink)
                sink.finish_file(f.name)
            stream.digests.check("tensor", "exported")
            sink.commit()
        plan = replace(plan, metadata={**plan.metadata, LD1_KEY: encode(_found(plan, digests))})
        fill_headers(tmp, plan.files, plan.metadata)
        try:
            if os.path.isdir(plan.out):
                os.rmdir(plan.out)  # empty (checked): replaced by the complete directory
            os.rename(tmp, plan.out)
        except OSError as e:
            raise StorageError.from_error(f"cannot rename {tmp} to {plan.out}", e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(plan, time.perf_counter() - t0, stream.done)


def _cache_bytes(plan: ExportPlan) -> int:
    """The source's chunk cache. Blocks of plain copies are whole source chunks
    (``contiguous_blocks`` aligns them, ``block_bytes`` widens them to a band of chunks): each
    chunk is decoded once, so a cache would only hold memory. Transposes, slices and chunks
    larger than a band read chunks that several blocks share: an eighth of the limit, plus two
    of the largest such chunks when they fit (``source_cache_bytes``), so each is decoded once."""
    from ckpt_cli.core.format.blocks import decoded_chunk_bytes
    from ckpt_cli.core.write.pipeline import source_cache_bytes

    budget, limit = _budget(plan.memory_limit), _limit(plan.memory_limit)
    shared = [t for t in plan.tensors if not _aligned(t, budget, limit)]
    if not shared:
        return 0
    sources = [n for t in shared for n in t.expr.walk() if isinstance(n, ops.Source)]
    return source_cache_bytes(plan.memory_limit, (decoded_chunk_bytes(n.info) for n in sources))


def _found(plan: ExportPlan, digests: BlockDigests) -> dict[str, str]:
    """Every exported tensor's ``ld1`` from the blocks written (an empty one: no block)."""
    import numpy as np

    from ckpt_cli.core.digest.ld1 import digest_array, finish
    from ckpt_cli.core.safetensors.dtypes import numpy_dtype

    out = {}
    for t in plan.tensors:
        p = digests.partials.get(t.name)
        empty = np.empty(t.shape, numpy_dtype(t.dtype))
        out[t.name] = finish(p) if p is not None else digest_array(empty, t.dtype)
    return out


def _context(cache_bytes: int) -> Any:
    """TensorStore's context for the source: a chunk cache of ``cache_bytes``, decoding on
    this process's threads (``core/threads.py``) so the blocks in flight decode together;
    memory is set by the blocks in flight, not by the threads."""
    from ckpt_cli.core.threads import ts_context

    return ts_context(cache_pool={"total_bytes_limit": max(0, cache_bytes)})


def _budget(memory_limit: int) -> int:
    """Bytes of one block. Small blocks are enough for a file: a positioned write of 8 MiB runs
    at disk speed."""
    from ckpt_cli.core.write.pipeline import block_budget

    return min(block_budget(memory_limit), 8 << 20)


def _aligned(t: ExportTensor, budget: int, limit: int) -> bool:
    """Whether every block of ``t`` is made of whole chunks of one source leaf (each decoded
    once), as ``contiguous_blocks`` cuts it with ``block_bytes``."""
    from ckpt_cli.core.format.dtypes import dtype_itemsize

    expr = t.expr
    while isinstance(expr, ops.Cast):
        expr = expr.inner
    if not isinstance(expr, ops.Source) or not t.shape:
        return isinstance(expr, ops.Source)
    row = math.prod(t.shape[1:]) * dtype_itemsize(t.dtype)
    rows = block_bytes(t, budget, limit) // max(1, row)
    return rows >= 1 and (rows >= t.shape[0] or rows >= expr.info.chunk_shape[0])


def block_bytes(t: ExportTensor, budget: int, limit: int) -> int:
    """Bytes of the blocks ``t`` is read in: ``budget``, or a band of whole source chunks along
    the first axis when blocks of ``budget`` would cut a source chunk (TensorStore decodes a
    chunk whole for every read that touches it) and the band fits ``limit``. The writer gets
    the band as one block: each source chunk is decoded once."""
    from ckpt_cli.core.format.dtypes import dtype_itemsize

    chunks = ops.source_chunks(t.expr)
    if chunks is None or len(chunks) != len(t.shape) or not t.shape:
        return budget
    band = max(1, chunks[0]) * math.prod(t.shape[1:]) * dtype_itemsize(t.dtype)
    return band if budget < band <= limit else budget


def _limit(memory_limit: int) -> int:
    """Bytes of the blocks in flight at once."""
    return max(2 * _budget(memory_limit), memory_limit // 4)


class _Opener:
    """Opens the source arrays a few tensors ahead: each open is a round trip of its own (the
    zarr header through OCDBT), so the next ones are in flight while a tensor streams."""

    AHEAD = 32

    def __init__(self, store: Any, ctx: ops.EvalContext, order: list[ExportTensor]) -> None:
        self.store = store
        self.ctx = ctx
        self.sources = [[n for n in t.expr.walk() if isinstance(n, ops.Source)] for t in order]
        self.index = {id(t): i for i, t in enumerate(order)}
        self.pending: dict[str, Any] = {}
        # The unmerged layout reads each process database on its own: ItemStore opens those.
        self.enabled = not (store.layout == "ocdbt-unmerged" and len(store.process_dbs) > 1)

    def ready(self, t: ExportTensor) -> None:
        if not self.enabled:
            return
        import tensorstore as ts

        from ckpt_cli.core.format.arrays import LeafReader
        from ckpt_cli.errors import StorageError

        i = self.index[id(t)]
        for sources in self.sources[i : i + self.AHEAD]:
            for n in sources:
                if n.name not in self.pending and n.name not in self.ctx.readers:
                    spec = self.store.array_spec(n.name, n.database)
                    self.pending[n.name] = ts.open(
                        spec, open=True, read=True, context=self.store.context
                    )
        for n in self.sources[i]:
            if n.name in self.ctx.readers:
                continue
            try:
                array = self.pending.pop(n.name).result()
            except Exception as e:
                raise StorageError(
                    f"cannot open leaf {n.name!r} of {self.store.item}: {self.store.item.describe_error(e)}",
                    hint="run `ckpt verify` on it",
                ) from None
            self.ctx.readers[n.name] = LeafReader(array, n.info)


class _Stream:
    """Blocks of the tensors in file order: reads a few blocks ahead (TensorStore decodes on its
    own threads) while one thread writes finished blocks, all under the memory limit. A tensor
    whose chunks are large (``tensor_slab``) is a job of its own instead (``export_slabs``), on
    a pool that reads and writes it while the blocks of the others flow."""

    def __init__(
        self,
        ctx: ops.EvalContext,
        memory_limit: int,
        on_bytes: Any,
        digests: BlockDigests,
        locate: Locate | None = None,
        finite_label: str | None = None,
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.ctx = ctx
        #: NaN/Inf refused, the error naming this source (None: ``--allow-nonfinite``).
        self.finite_label = finite_label
        self.locate = locate  # where streamed chunks lie in local files (verify's references)
        self.digests = digests  # verify while writing: tensors with a carried ld1
        self.budget = _budget(memory_limit)
        self.limit = _limit(memory_limit)
        # Blocks in flight are bounded by bytes (``limit``), not by count: 8 blocks of 8 MiB
        # under the default limit keep TensorStore's decoding threads and the writer busy.
        self.depth = max(4, self.limit // self.budget)
        self.on_bytes = on_bytes
        self.reads: deque[tuple[ExportTensor, tuple[int, ...], Any, int]] = deque()
        #: (the write, its bytes, what absorbs its block's ld1 partial taken meanwhile)
        self.writes: deque[tuple[Any, int, Callable[[], None] | None]] = deque()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-export-write")
        self.held = 0
        self.done = 0
        n = threads()
        self.slab = slab_bytes(self.limit, n)
        self.job_pool = ThreadPoolExecutor(
            jobs_for(memory_limit, self.slab, n), thread_name_prefix="ckpt-export-job"
        )
        self.jobs: deque[tuple[SlabJob, Any, int]] = deque()

    def close(self) -> None:
        for job, _, _ in self.jobs:
            job.cancelled = True
        self.job_pool.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def tensor(self, t: ExportTensor, sink: Any) -> None:
        from ckpt_cli.core.format.dtypes import dtype_itemsize
        from ckpt_cli.core.safetensors.blocks import contiguous_blocks

        job = self._job(t)
        if job is not None:
            sink.share(t.name)  # jobs write in any order: through the page cache
            fut = self.job_pool.submit(job.run, sink.write, self.on_bytes)
            self.jobs.append((job, fut, math.prod(t.shape) * dtype_itemsize(t.dtype)))
            while self.jobs and self.jobs[0][1].done():
                self._finish_job()
            return
        whole = frozenset(id(n) for n in t.expr.walk() if n.whole)
        itemsize = dtype_itemsize(t.dtype)
        chunks = ops.source_chunks(t.expr)
        size = block_bytes(t, self.budget, self.limit)
        for start, shape in contiguous_blocks(t.shape, itemsize, size, chunks):
            self.ctx.begin(whole)
            region = tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))
            nbytes = math.prod(shape) * itemsize
            self.reads.append((t, start, t.expr.fetch(region, self.ctx), nbytes))
            self.held += nbytes
            while self.reads and (len(self.reads) > self.depth or self.held > self.limit):
                self._start_write(sink)
            while self.writes and (len(self.writes) > self.depth or self.held > self.limit):
                self._finish_write()

    def drain(self, sink: Any) -> None:
        while self.reads:
            self._start_write(sink)
        while self.writes:
            self._finish_write()
        while self.jobs:
            self._finish_job()

    def _job(self, t: ExportTensor) -> SlabJob | None:
        """A job streaming ``t`` slab by slab, when it is a leaf (or casts of one) whose chunks
        are large enough (``tensor_slab``) and can be streamed here; None: blocks through
        TensorStore."""
        from ckpt_cli.core.format.blocks import decoded_chunk_bytes
        from ckpt_cli.core.format.scan import streamed_slabs

        chain = cast_chain(t.expr)
        if chain is None:
            return None
        source, casts = chain
        slab = tensor_slab(self.slab, decoded_chunk_bytes(source.info))
        if slab is None:
            return None
        reader = self.ctx.reader(source.name, source.info, source.database)
        where = functools.partial(self.locate, source.name) if self.locate else None
        slabs = streamed_slabs(source.info, reader, slab, c_order=True, locate=where)
        if slabs is None:
            return None
        ld1 = t.name in self.digests.collect
        return SlabJob(t.name, slabs, casts, t.shape, t.dtype, ld1, self.finite_label)

    def _finish_job(self) -> None:
        from ckpt_cli.errors import CkptError, StorageError, first_line

        job, fut, nbytes = self.jobs.popleft()
        try:
            found = fut.result()
        except CkptError:
            raise
        except Exception as e:
            raise StorageError(f"cannot read the source of {job.name!r}: {first_line(e)}") from None
        if found is not None:
            self.digests.absorb(job.name, found)
        self.done += nbytes

    def _start_write(self, sink: Any) -> None:
        import numpy as np

        from ckpt_cli.core.safetensors.dtypes import numpy_dtype
        from ckpt_cli.errors import CkptError, StorageError, first_line

        t, start, fut, nbytes = self.reads.popleft()
        try:
            values = ops.resolve(fut)
        except CkptError:
            raise
        except Exception as e:
            raise StorageError(f"cannot read the source of {t.name!r}: {first_line(e)}") from None
        want = numpy_dtype(t.dtype)
        if values.dtype != want:
            values = values.astype(want)
        block = np.asarray(values, order="C")
        check_finite(t.name, self.finite_label, block)
        absorb = self.digests.add(t.name, start, block, t.shape, t.dtype, later=True)
        self.writes.append((self.pool.submit(sink.write, t.name, start, block), nbytes, absorb))

    def _finish_write(self) -> None:
        fut, nbytes, absorb = self.writes.popleft()
        fut.result()
        if absorb is not None:
            absorb()
        self.held -= nbytes
        self.done += nbytes
        if self.on_bytes is not None:
            self.on_bytes(nbytes)
