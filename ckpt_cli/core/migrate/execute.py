"""Write a migration plan: every destination leaf computed region by region from the source
item by its expression (a worker of a scaled-out run rebuilds it from ``ComputeLeaf``), then
the new step's digests recorded when asked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.digest.carried import carried, recorded_leaves
from ckpt_cli.core.digest.records import read_digests
from ckpt_cli.core.format.arrays import ItemStore, cached_context
from ckpt_cli.core.format.blocks import decoded_chunk_bytes
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.scan import Locate
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.migrate.plan import DestLeaf, MigrationPlan
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.target import import_function
from ckpt_cli.core.storage import Location, open_location
from ckpt_cli.core.verify.gate import chunk_locator, require_sound_source
from ckpt_cli.core.write.pipeline import source_cache_bytes
from ckpt_cli.core.write.rewrite import ItemOut, WriteResult, prepare_destination, run_write
from ckpt_cli.core.write.types import (
    ArrayOut,
    BlockSource,
    Compression,
    LeafOut,
    stored_key_types,
    stored_keypath,
)
from ckpt_cli.errors import CkptError


def execute(plan: MigrationPlan, on_progress: ProgressFn | None = None) -> WriteResult:
    """Write the planned step (refused plans raise their ``RefusedError``), then record its
    digests when the plan asks (or, by default, when the source has a record). Progress as
    ``migrate`` bytes."""
    if plan.refusal is not None:
        raise plan.refusal
    # The structure check's OCDBT references: where each source chunk lies in a local file.
    located = {plan.source: chunk_locator(require_sound_source(plan.source))}
    prepare_destination(plan.destination, plan.source)
    for item in plan.more:
        require_sound_source(item.source)
    write = plan.write
    items = []
    for item in plan.items:
        outs = migrate_leaves(
            item.report, item.leaves, plan.zarr3, write.compression, write.memory_limit,
            plan.functions, located.get(item.source),
        )  # fmt: skip
        # Unchanged leaves keep their recorded ld1: checked against the blocks written.
        exprs = {out.name: leaf.expr for out, leaf in zip(outs, item.leaves, strict=True)}
        expect = carried(recorded_leaves(item.source.location), ops.source_reads(exprs))
        items.append(ItemOut(item.source, outs, None, item.report.kind, expect))
    record = plan.record_digests
    if record is None:
        record = has_digests(plan.source.location)
    out, seconds = run_write(
        items,
        plan.destination,
        write,
        zarr3=plan.zarr3,
        label="migrate",
        operation=plan.operation,
        on_progress=on_progress,
        step=plan.step_out,
    )
    return WriteResult(plan, out, seconds, digests_of(out.path, plan.destination, record))


@dataclass(frozen=True)
class ComputeLeaf:
    """A worker's recipe for a migrated leaf: the expression (frozen dataclasses over source leaf
    names) and the ``module:function`` names its python rules call, imported on the worker."""

    source: str
    source_zarr3: bool
    expr: ops.Node
    functions: tuple[str, ...]

    @property
    def splittable(self) -> bool:
        return self.expr.streams

    def build(self, store: ItemStore) -> BlockSource:
        functions = {f: import_function(f, "migrate function") for f in self.functions}
        return _source(self.expr, ops.EvalContext(store, functions))


def migrate_leaves(
    report: ItemReport,
    planned: Sequence[DestLeaf],
    zarr3: bool,
    compression: Compression,
    memory_limit: int,
    functions: dict[str, Callable[..., Any]] | None = None,
    locate: Locate | None = None,
) -> list[LeafOut]:
    """The output leaves of an item's plan, each array computing its regions from the source
    item (``locate``: where its chunks lie in local files, ``ItemStore.locate``)."""
    # Source chunks that straddle output blocks (or are read in slabs) are decoded once, then
    # served from the cache.
    chunks = (decoded_chunk_bytes(leaf.array) for leaf in report.leaves if leaf.array is not None)
    cache = cached_context(source_cache_bytes(memory_limit, chunks))
    store = ItemStore(report.ref.location, report.zarr_format == 3, cache)
    store.locate = locate
    ctx = ops.EvalContext(store, functions or {})
    out = []
    for leaf in planned:
        array = source = recipe = None
        layout = leaf.layout
        if leaf.expr is not None and layout is not None:
            array = ArrayOut(
                leaf.expr.dtype, leaf.expr.shape, layout.chunk_shape, zarr3, compression
            )
            source = _source(leaf.expr, ctx)
            used = tuple(sorted(n.function for n in leaf.expr.walk() if isinstance(n, ops.Python)))
            recipe = ComputeLeaf(str(report.ref.location), report.zarr_format == 3, leaf.expr, used)
        out.append(
            LeafOut(
                keypath=stored_keypath(leaf.keypath, report.kind),
                key_types=stored_key_types(leaf.key_types, report.kind),
                value_type=leaf.value_type,
                array=array,
                source=source,
                sharding=layout.sharding if layout is not None else None,
                write_shape=layout.write_shape if layout is not None else None,
                ext_metadata={"random_key_impl": leaf.random_key_impl}
                if leaf.random_key_impl
                else None,
                string_value=leaf.string_value,
                source_chunks=ops.source_chunks(leaf.expr) if leaf.expr is not None else None,
                source_chunk_bytes=_largest_source_chunk(leaf.expr),
                source_itemsize=_source_itemsize(leaf.expr),
                fresh_blocks=leaf.expr is not None and ops.fresh_blocks(leaf.expr),
                plan=recipe,
            )
        )
    return out


def _sources(expr: ops.Node | None) -> list[ops.Source]:
    """The stored leaves an expression reads."""
    return [n for n in (expr.walk() if expr else []) if isinstance(n, ops.Source)]


def _largest_source_chunk(expr: ops.Node | None) -> int | None:
    """Bytes of the largest decoded source chunk an expression reads (None: reads none)."""
    return max((decoded_chunk_bytes(n.info) for n in _sources(expr)), default=None)


def _source_itemsize(expr: ops.Node | None) -> int | None:
    """Bytes per output element the expression's source reads hold (None: reads none)."""
    sources = _sources(expr)
    return sum(dtype_itemsize(n.info.dtype) for n in sources) if sources else None


def _source(expr: ops.Node, ctx: ops.EvalContext) -> Callable[[ops.Region], Any]:
    whole = frozenset(id(n) for n in expr.walk() if n.whole)

    def read(region: ops.Region) -> Any:
        ctx.begin(whole)
        return expr.fetch(region, ctx)

    return read


def digests_of(path: str, destination: Location, record: bool) -> str | None:
    """The ``digests`` of a written step's result: when ``record``, the step at ``path`` (in
    ``destination``'s storage) read back and its digests recorded; None when not asked."""
    if not record:
        return None
    recorded = record_step_digests(open_location(path, destination.options))
    return "recorded" if recorded else "not recorded (run `ckpt verify` on the step)"


def record_step_digests(step: Location) -> tuple[str, ...]:
    """Read the written step back once and record its digests (``ckpt verify --record``): the
    items recorded, none when verification found an error."""
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    report = verify_path(step, VerifyOptions(record=True))
    return report.recorded


def has_digests(item: Location) -> bool:
    try:
        return read_digests(item) is not None
    except CkptError:  # a damaged record is verify's business; migrate does not carry it
        return False
