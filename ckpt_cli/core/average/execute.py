"""Write an average plan: each averaged leaf's blocks read at every listed step (all reads in
flight together), accumulated in float32 (float64 for float64 leaves) with the steps'
coefficients and cast back to the leaf's dtype; every other leaf copied from the last step.

Memory: a block in flight holds its values at each step besides the sum, so the writer's
``--memory-limit`` is divided among them (``step_memory_limit``) and the pipeline's own bound
then keeps the whole under the limit. A worker of a scaled-out run rebuilds a leaf's reader
from ``MeanLeaf`` (the item URL of every step and the coefficients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ckpt_cli.core.average.plan import AverageItem, AveragePlan
from ckpt_cli.core.digest.records import read_digests
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore, cached_context
from ckpt_cli.core.format.blocks import decoded_chunk_bytes
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.migrate.execute import digests_of, has_digests
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.reshard.execute import reshard_leaves
from ckpt_cli.core.storage import open_location
from ckpt_cli.core.verify.gate import require_sound_source
from ckpt_cli.core.write.pipeline import source_cache_bytes
from ckpt_cli.core.write.rewrite import ItemOut, WriteResult, prepare_destination, run_write
from ckpt_cli.core.write.types import BlockSource, LeafOut, Region, WriteOptions

#: The smallest limit handed to the writer, whatever the number of steps.
_MIN_LIMIT = 16 << 20


def execute(plan: AveragePlan, on_progress: ProgressFn | None = None) -> WriteResult:
    """Write the averaged step; its digests recorded when the last step has a record. Progress
    as ``average`` bytes of the new step."""
    for item in plan.items:
        for ref, _ in item.steps:
            require_sound_source(ref)
    prepare_destination(plan.destination, plan.source)
    write = step_write_options(plan.write, len(plan.steps))
    items = [_item_out(item, plan, write) for item in plan.items]
    out, seconds = run_write(
        items,
        plan.destination,
        write,
        zarr3=plan.zarr3,
        label="average",
        operation=plan.operation,
        on_progress=on_progress,
        step=plan.step_out,
        skip_items=frozenset(plan.dropped_items),
        sources=f"the average of steps {', '.join(map(str, plan.steps))} of "
        f"{plan.source.root or plan.source.location}",
    )
    record = has_digests(plan.source.location)
    return WriteResult(plan, out, seconds, digests_of(out.path, plan.destination, record))


def step_write_options(write: WriteOptions, steps: int) -> WriteOptions:
    """The writer's options for ``steps`` inputs: a block costs its values at every step, the
    float32 sum and the output (about ``steps + 3`` blocks where a copy costs 3), so the
    writer's limit is ``3 / (steps + 3)`` of the user's and chunks a quarter of that."""
    limit = max(_MIN_LIMIT, write.memory_limit * 3 // (steps + 3))
    chunk = min(write.max_chunk_bytes, limit // 4)
    return replace(write, memory_limit=limit, max_chunk_bytes=chunk)


def _item_out(item: AverageItem, plan: AveragePlan, write: WriteOptions) -> ItemOut:
    """The base item's leaves (copied from the last step), the averaged ones reading every
    step; the last step's recorded digests carried for the copied leaves."""
    leaves = reshard_leaves(
        item.report, item.layout, plan.zarr3, write.compression, write.memory_limit
    )
    kept = [leaf for leaf, a in zip(item.report.leaves, item.actions, strict=True) if a != "drop"]
    averaged = {
        leaf.name
        for leaf, a in zip(item.report.leaves, item.actions, strict=True)
        if a == "average"
    }
    assert len(kept) == len(leaves)
    chunks = [decoded_chunk_bytes(lf.array) for _, r in item.steps for lf in r.leaves if lf.array]
    cache = cached_context(source_cache_bytes(write.memory_limit, chunks))
    stores = [ItemStore(ref.location, report.zarr_format == 3, cache) for ref, report in item.steps]
    out = []
    for leaf, written in zip(kept, leaves, strict=True):
        if leaf.name in averaged:
            written = _averaged(written, leaf.name, item, stores, plan.coefficients)
        out.append(written)
    record = read_digests(item.source.location)
    names = {x.name for x in out if x.name not in averaged}
    carried = {k: v for k, v in record.leaves.items() if k in names} if record else None
    return ItemOut(item.source, out, carried, item.report.kind)


def _averaged(
    written: LeafOut,
    name: str,
    item: AverageItem,
    stores: Sequence[ItemStore],
    coefficients: Sequence[float],
) -> LeafOut:
    """``written`` (the base's leaf) with its values the mean of the steps' values."""
    inputs = []
    for (ref, report), store in zip(item.steps, stores, strict=True):
        leaf = next(lf for lf in report.leaves if lf.name == name)
        assert leaf.array is not None
        inputs.append(
            _Input(str(ref.location), store.use_zarr3, leaf.name, leaf.array, leaf.database)
        )
    assert written.array is not None
    recipe = MeanLeaf(tuple(inputs), tuple(coefficients), written.array.dtype)
    sizes = [decoded_chunk_bytes(i.info) for i in inputs]
    return replace(
        written,
        source=recipe.reader(list(stores)),
        source_chunk_bytes=max(sizes),
        source_itemsize=sum(dtype_itemsize(i.info.dtype) for i in inputs),  # read together
        plan=recipe,
    )


@dataclass(frozen=True)
class _Input:
    """One step's stored leaf: the item URL, its zarr version, the leaf's name and header."""

    url: str
    zarr3: bool
    name: str
    info: ArrayInfo
    database: str


@dataclass(frozen=True)
class MeanLeaf:
    """A worker's recipe for an averaged leaf: the same leaf in every step's item, each step's
    coefficient, and the output dtype."""

    inputs: tuple[_Input, ...]
    coefficients: tuple[float, ...]
    dtype: str
    splittable: bool = True

    @property
    def source(self) -> str:
        return self.inputs[-1].url

    @property
    def source_zarr3(self) -> bool:
        return self.inputs[-1].zarr3

    def build(self, store: ItemStore) -> BlockSource:
        """The reader on a worker: ``store`` is the last step's item; the others opened beside
        it, with its storage options and chunk cache."""
        stores = [
            store
            if i.url == self.source
            else ItemStore(open_location(i.url, store.item.options), i.zarr3, store.context)
            for i in self.inputs
        ]
        return self.reader(stores)

    def reader(self, stores: Sequence[ItemStore]) -> BlockSource:
        readers = [
            s.reader(i.name, i.info, i.database) for s, i in zip(stores, self.inputs, strict=True)
        ]
        coefficients, dtype = self.coefficients, self.dtype

        def read(region: Region) -> _Mean:
            return _Mean([r.read(region) for r in readers], coefficients, dtype)

        return read


class _Mean:
    """A block being averaged: every step's read in flight; ``result`` sums them as they land."""

    def __init__(self, reads: list[Any], coefficients: Sequence[float], dtype: str) -> None:
        self.reads = reads
        self.coefficients = coefficients
        self.dtype = dtype

    def result(self) -> Any:
        """The weighted sum in float32 (float64 for a float64 leaf); the pipeline casts it to
        the output array's dtype (round to nearest even) as it writes."""
        import numpy as np

        acc_dtype = np.float64 if self.dtype == "float64" else np.float32
        total: Any = None
        for k, coefficient in enumerate(self.coefficients):
            read, self.reads[k] = self.reads[k], None
            values = read.result() if hasattr(read, "result") else read
            term: Any = np.asarray(values).astype(acc_dtype)
            del values, read
            np.multiply(term, acc_dtype(coefficient), out=term)
            if total is None:
                total = term
            else:
                np.add(total, term, out=total)
            del term
        assert total is not None
        return total
