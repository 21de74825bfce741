"""Plan and run ``ckpt export``: one Orbax item into safetensors files Hugging Face loads.

``plan_export`` decides everything before a byte is written: which leaves go (``params_only``
keeps the leaves ``inspect`` calls parameters), their names and shapes (a migrate spec, applied
by migrate's own rule engine), their dtype (``dtype`` casts floating leaves), the files and
every offset in them. A leaf safetensors cannot hold (strings, typed PRNG keys, int4, complex)
is refused there, with a hint. ``execute`` streams the plan: blocks of each tensor are computed
from the source through TensorStore, a few in flight under the memory limit, and written at
their offsets into files of a temporary directory that is renamed to the output when complete.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core import migrate_ops as ops
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.layout import ItemRef
from ckpt_cli.core.migrate import DestLeaf, plan_migration
from ckpt_cli.core.migrate_spec import MigrationSpec
from ckpt_cli.core.migrate_tree import Step
from ckpt_cli.core.safetensors.dtypes import safetensors_dtype
from ckpt_cli.core.safetensors.plan import FilesPlan, TensorSpec, plan_files
from ckpt_cli.errors import RefusedError

SCHEMA_VERSION = 1
FRAMEWORKS = ("pt", "np", "flax", "tf", "mlx")
CAST_DTYPES = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
#: transformers' default for ``save_pretrained(max_shard_size=...)``: 5 GB (decimal).
DEFAULT_MAX_SHARD = 5 * 10**9


@dataclass(frozen=True)
class ExportTensor:
    """One tensor of the output: its name, dtype and shape, and how its values are computed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    expr: ops.Node
    sources: tuple[str, ...]
    steps: tuple[Step, ...]
    file: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.expr_itemsize

    @property
    def expr_itemsize(self) -> int:
        from ckpt_cli.core.arrays import dtype_itemsize

        return dtype_itemsize(self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "bytes": self.nbytes,
            "file": self.file,
            "from": list(self.sources),
            "operations": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class Skipped:
    """A source leaf that is not exported, and why."""

    name: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class ExportPlan:
    source: str
    item: str
    step: int | None
    orbax_format: str
    out: str
    files: FilesPlan
    tensors: tuple[ExportTensor, ...]
    skipped: tuple[Skipped, ...]
    metadata: dict[str, str]
    spec: str | None
    unused_rules: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return self.files.total_size

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "source": {
                "path": self.source,
                "item": self.item,
                "step": self.step,
                "orbax_format": self.orbax_format,
            },
            "out": self.out,
            "format": "safetensors",
            "spec": self.spec,
            "metadata": self.metadata,
            "total_bytes": self.total_bytes,
            "index": self.files.index_name,
            "files": [
                {"name": f.name, "bytes": f.size, "tensors": len(f.header.tensors)}
                for f in self.files.files
            ],
            "tensors": [t.to_json() for t in self.tensors],
            "skipped": [s.to_json() for s in self.skipped],
            "unused_rules": list(self.unused_rules),
        }


def orbax_format(report: ItemReport) -> str:
    return f"{report.storage} zarr{report.zarr_format}"


def plan_export(
    ref: ItemRef,
    report: ItemReport,
    out: str,
    *,
    spec: MigrationSpec | None = None,
    params_only: bool = False,
    dtype: str | None = None,
    max_shard_size: int | None = DEFAULT_MAX_SHARD,
    framework: str = "pt",
    provenance: bool = True,
    allow_unused: bool = False,
) -> ExportPlan:
    """Everything an export writes, decided and checked; nothing is read or written."""
    if framework not in FRAMEWORKS:
        raise RefusedError(f"unknown framework {framework!r} (use one of {', '.join(FRAMEWORKS)})")
    if dtype is not None and dtype not in CAST_DTYPES:
        raise RefusedError(
            f"--dtype {dtype}: exports cast floating leaves to one of {', '.join(CAST_DTYPES)}"
        )
    skipped: list[Skipped] = []
    leaves = list(report.leaves)
    if params_only:
        kept = [leaf for leaf in leaves if leaf.part == "params"]
        if not kept:
            raise RefusedError(
                f"{ref.location} has no leaf `inspect` calls a model parameter; nothing to export",
                hint="run `ckpt inspect` to see the tree, and export without --params-only or with a spec",
            )
        skipped += [
            Skipped(x.name, f"--params-only ({x.part or 'not a parameter'})")
            for x in leaves
            if x.part != "params"
        ]
        report = dataclasses.replace(report, leaves=tuple(kept))
    rules = spec or MigrationSpec(path="", sha256="", rules=())
    migration = plan_migration(report, rules, max_chunk_bytes=1 << 62)
    if migration.unused_rules and not allow_unused:
        raise RefusedError(
            f"{', '.join(migration.unused_rules)} matched no leaf; nothing written",
            hint="--dry-run lists the tensors; --allow-unused goes on without them",
        )
    skipped += [Skipped(name, "dropped by the spec") for name in migration.dropped]
    exported: list[DestLeaf] = []
    for leaf in migration.leaves:
        if leaf.expr is None:
            if leaf.value_type == "string":
                raise _refuse(leaf.name, "is a string: safetensors holds arrays only")
            skipped.append(Skipped(leaf.name, f"no array data ({leaf.value_type})"))
            continue
        if leaf.random_key_impl:
            raise _refuse(
                leaf.name,
                f"is a typed PRNG key ({leaf.random_key_impl}): safetensors has no key dtype",
            )
        exported.append(leaf)
    exprs = {leaf.name: _cast(leaf, dtype) for leaf in exported}
    specs = [TensorSpec(name, e.dtype, e.shape) for name, e in exprs.items()]
    for s in specs:
        safetensors_dtype(s.dtype, f"leaf {s.name!r}")
    source = str(ref.root or ref.step_location or ref.location)
    metadata = {"format": framework}
    if provenance:
        metadata.update(
            {
                "ckpt.source": source,
                "ckpt.item": ref.name,
                "ckpt.orbax_format": orbax_format(report),
            }
        )
        if ref.step is not None:
            metadata["ckpt.step"] = str(ref.step)
        if spec is not None:
            metadata["ckpt.spec_sha256"] = spec.sha256
    files = plan_files(specs, max_shard_size=max_shard_size, metadata=metadata)
    where = files.weight_map
    tensors = tuple(
        ExportTensor(
            leaf.name,
            exprs[leaf.name].dtype,
            exprs[leaf.name].shape,
            exprs[leaf.name],
            leaf.sources,
            leaf.steps + _cast_step(leaf, exprs[leaf.name]),
            where[leaf.name],
        )
        for leaf in exported
    )
    return ExportPlan(
        source=source,
        item=ref.name,
        step=ref.step,
        orbax_format=orbax_format(report),
        out=os.path.abspath(out) if "://" not in out else out,
        files=files,
        tensors=tensors,
        skipped=tuple(skipped),
        metadata=metadata,
        spec=spec.path if spec is not None else None,
        unused_rules=migration.unused_rules,
    )


def _refuse(name: str, why: str) -> RefusedError:
    return RefusedError(
        f"leaf {name!r} {why}; nothing written",
        hint="drop it with a spec rule `op: drop`, or export the parameters only with --params-only",
    )


def _cast(leaf: DestLeaf, dtype: str | None) -> ops.Node:
    expr = leaf.expr
    assert expr is not None
    if dtype is None or not ops.is_float(expr.dtype) or expr.dtype == dtype:
        return expr
    return ops.Cast(
        shape=expr.shape, dtype=dtype, inner=expr, rounding=None, label="--dtype", leaf=leaf.name
    )


def _cast_step(leaf: DestLeaf, expr: ops.Node) -> tuple[Step, ...]:
    assert leaf.expr is not None
    if expr is leaf.expr:
        return ()
    return (Step(0, "cast", f"{leaf.expr.dtype} -> {expr.dtype} (--dtype)"),)


@dataclass(frozen=True)
class ExportResult:
    plan: ExportPlan
    seconds: float
    bytes_written: int

    def to_json(self) -> dict[str, Any]:
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


def execute(
    plan: ExportPlan,
    report: ItemReport,
    *,
    memory_limit: int,
    on_bytes: Any = None,
) -> ExportResult:
    """Write the plan's files into a temporary directory, then rename it to ``plan.out``."""
    import contextlib
    import secrets
    import shutil
    import time

    from ckpt_cli.core.arrays import ItemStore, cached_context
    from ckpt_cli.core.safetensors.sink import SafetensorsSink
    from ckpt_cli.errors import StorageError

    check_output(plan.out)
    t0 = time.perf_counter()
    parent = os.path.dirname(plan.out) or "."
    tmp = os.path.join(parent, f".{os.path.basename(plan.out)}.ckpt-tmp-{secrets.token_hex(4)}")
    try:
        os.makedirs(parent, exist_ok=True)
        os.mkdir(tmp)
    except OSError as e:
        raise StorageError(f"cannot create {tmp}: {e.strerror or e}") from None
    try:
        store = ItemStore(
            report.ref.location, report.zarr_format == 3, cached_context(memory_limit // 8)
        )
        ctx = ops.EvalContext(store, {})
        stream = _Stream(ctx, memory_limit, on_bytes)
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
            sink.commit()
        if os.path.isdir(plan.out):
            os.rmdir(plan.out)  # empty (checked): replaced by the complete directory
        os.rename(tmp, plan.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(plan, time.perf_counter() - t0, stream.done)


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

        from ckpt_cli.core.arrays import LeafReader
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
    own threads) while one thread writes finished blocks, all under the memory limit."""

    def __init__(self, ctx: ops.EvalContext, memory_limit: int, on_bytes: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from ckpt_cli.core.pipeline import block_budget

        self.ctx = ctx
        # Small blocks are enough for a file: a positioned write of 8 MiB runs at disk speed.
        self.budget = min(block_budget(memory_limit), 8 << 20)
        self.limit = max(2 * self.budget, memory_limit // 4)
        self.depth = 4
        self.on_bytes = on_bytes
        self.reads: deque[tuple[ExportTensor, tuple[int, ...], Any, int]] = deque()
        self.writes: deque[tuple[Any, int]] = deque()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-export-write")
        self.held = 0
        self.done = 0

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def tensor(self, t: ExportTensor, sink: Any) -> None:
        from ckpt_cli.core.arrays import dtype_itemsize
        from ckpt_cli.core.safetensors.blocks import contiguous_blocks

        whole = frozenset(id(n) for n in t.expr.walk() if n.whole)
        itemsize = dtype_itemsize(t.dtype)
        chunks = ops.source_chunks(t.expr)
        for start, shape in contiguous_blocks(t.shape, itemsize, self.budget, chunks):
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
        self.writes.append((self.pool.submit(sink.write, t.name, start, block), nbytes))

    def _finish_write(self) -> None:
        fut, nbytes = self.writes.popleft()
        fut.result()
        self.held -= nbytes
        self.done += nbytes
        if self.on_bytes is not None:
            self.on_bytes(nbytes)
