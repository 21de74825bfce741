"""Write a reshard plan: every array leaf read region by region from the source item, straight
into the new chunking (a worker of a scaled-out run rebuilds the reader from ``ReadLeaf``)."""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_cli.core.digest.records import read_digests
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, cached_context
from ckpt_cli.core.format.blocks import decoded_chunk_bytes
from ckpt_cli.core.format.scan import Locate
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.reshard.plan import ReshardLayout, ReshardPlan
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


@dataclass(frozen=True)
class ReadLeaf:
    """A worker's recipe for a resharded leaf: read the same region of the stored source leaf."""

    source: str
    source_zarr3: bool
    name: str
    info: ArrayInfo
    database: str
    splittable: bool = True

    def build(self, store: ItemStore) -> BlockSource:
        return store.reader(self.name, self.info, self.database).read


def execute(plan: ReshardPlan, on_progress: ProgressFn | None = None) -> WriteResult:
    """Write the planned step, every planned item (refused plans raise their
    ``RefusedError``). Values do not change, so the source's recorded digests carry over to
    each new item. Progress as
    ``reshard`` bytes."""
    if plan.refusal is not None:
        raise plan.refusal
    # The structure check's OCDBT references: where each source chunk lies in a local file.
    located = [chunk_locator(require_sound_source(item.source)) for item in plan.items]
    prepare_destination(plan.destination, plan.source)
    items = []
    for item, locate in zip(plan.items, located, strict=True):
        leaves = reshard_leaves(
            item.report,
            item.layout,
            plan.zarr3,
            plan.write.compression,
            plan.write.memory_limit,
            locate,
        )
        record = read_digests(item.source.location)
        names = {x.name for x in leaves}
        carried = {k: v for k, v in record.leaves.items() if k in names} if record else None
        items.append(ItemOut(item.source, leaves, carried, item.report.kind))
    out, seconds = run_write(
        items,
        plan.destination,
        plan.write,
        zarr3=plan.zarr3,
        label="reshard",
        operation=plan.operation,
        on_progress=on_progress,
    )
    return WriteResult(plan, out, seconds)


def reshard_leaves(
    report: ItemReport,
    plan: ReshardLayout,
    zarr3: bool,
    compression: Compression,
    memory_limit: int,
    locate: Locate | None = None,
) -> list[LeafOut]:
    """The output leaves of a plan, each array reading its values from the source item
    (``locate``: where its chunks lie in local files, ``ItemStore.locate``)."""
    # Source chunks that straddle output blocks (or are read in slabs) are decoded once, then
    # served from the cache.
    chunks = (decoded_chunk_bytes(leaf.array) for leaf in report.leaves if leaf.array is not None)
    cache = cached_context(source_cache_bytes(memory_limit, chunks))
    store = ItemStore(report.ref.location, report.zarr_format == 3, cache)
    store.locate = locate
    out = []
    for p in plan.leaves:
        leaf = p.leaf
        array = source = source_chunks = source_chunk_bytes = recipe = None
        if leaf.array is not None and leaf.dtype is not None and leaf.shape is not None:
            array = ArrayOut(leaf.dtype, leaf.shape, p.chunk_shape, zarr3, compression)
            source = store.reader(leaf.name, leaf.array, leaf.database).read
            source_chunks = leaf.array.chunk_shape
            source_chunk_bytes = decoded_chunk_bytes(leaf.array)
            recipe = ReadLeaf(
                str(report.ref.location),
                report.zarr_format == 3,
                leaf.name,
                leaf.array,
                leaf.database,
            )
        out.append(
            LeafOut(
                keypath=stored_keypath(leaf.keypath, report.kind),
                key_types=stored_key_types(leaf.key_types, report.kind),
                value_type=leaf.value_type,
                array=array,
                source=source,
                sharding=p.sharding,
                write_shape=p.write_shape if array is not None else None,
                ext_metadata={"random_key_impl": leaf.random_key_impl}
                if leaf.random_key_impl
                else None,
                string_value=leaf.value if leaf.value_type == "string" else None,
                source_chunks=source_chunks,
                source_chunk_bytes=source_chunk_bytes,
                plan=recipe,
            )
        )
    return out
