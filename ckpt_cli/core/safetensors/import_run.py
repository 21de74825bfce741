"""Run an import plan: the step writer asks for chunk-aligned regions of each leaf, read from
the safetensors files by positioned reads, under the plan's memory limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.safetensors.import_ import ImportPlan, ImportPlanJSON
from ckpt_cli.core.safetensors.tensor_source import ImportContext
from ckpt_cli.core.safetensors.tree import STEP_NAME_KEY
from ckpt_cli.core.spec import ops

if TYPE_CHECKING:
    from ckpt_cli.core.storage import Location
    from ckpt_cli.core.write.types import LeafOut


class ImportWrittenJSON(TypedDict):
    path: str
    bytes: int
    seconds: float


class ImportJSON(ImportPlanJSON):
    """``ckpt import --json``: the leaves planned from the safetensors files, and what was
    written."""

    written: NotRequired[ImportWrittenJSON]


@dataclass(frozen=True)
class ImportResult:
    plan: ImportPlan
    path: str
    bytes_written: int
    seconds: float

    def to_json(self) -> ImportJSON:
        return {
            **self.plan.to_json(),
            "written": {
                "path": self.path,
                "bytes": self.bytes_written,
                "seconds": round(self.seconds, 3),
            },
        }


def execute(plan: ImportPlan, on_progress: ProgressFn | None = None) -> ImportResult:
    """Write the plan as step ``plan.step`` of the root ``plan.dst`` (tmp name, then renamed;
    in place with the commit marker last on object stores). Progress as ``import`` bytes."""
    import contextlib
    import time

    from ckpt_cli.core.progress import ByteProgress
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.write.rewrite import check_destination_root
    from ckpt_cli.core.write.step import StepWriter
    from ckpt_cli.errors import CkptError

    on_bytes = ByteProgress(on_progress, "import", plan.total_bytes)
    t0 = time.perf_counter()
    root = open_location(plan.dst, plan.storage)
    check_destination_root(root)
    ctx = ImportContext()
    outs = _leaf_outs(plan, ctx)
    writer = StepWriter(root, _step_name(root, plan.step, plan.source_metadata.get(STEP_NAME_KEY)))
    writer.begin()
    try:
        _write_item(writer.item(plan.item), plan, outs, on_bytes)
        final = writer.commit({"ckpt_history": [_history(plan)]})
    except BaseException:
        with contextlib.suppress(CkptError):
            writer.abort()
        raise
    finally:
        ctx.close()
    return ImportResult(plan, str(final), plan.total_bytes, time.perf_counter() - t0)


def _leaf_outs(plan: ImportPlan, ctx: ImportContext) -> list[LeafOut]:
    """Every leaf as the step writer takes it, its blocks read from the safetensors files."""
    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    zarr3, comp = bool(plan.write.zarr3), plan.write.compression
    empties = [LeafOut(n.keypath, n.key_types, n.value_type) for n in plan.empties]
    return [
        LeafOut(
            keypath=leaf.keypath,
            key_types=leaf.key_types,
            value_type=leaf.value_type,
            array=ArrayOut(leaf.expr.dtype, leaf.expr.shape, leaf.chunk_shape, zarr3, comp),
            source=_reader(leaf.expr, ctx),
            sharding=leaf.sharding,
            write_shape=leaf.write_shape,
            fresh_blocks=ops.fresh_blocks(leaf.expr),
        )
        for leaf in plan.leaves
    ] + empties


def _write_item(
    dest: Location, plan: ImportPlan, outs: list[LeafOut], on_bytes: Callable[[int], None]
) -> None:
    """The item's arrays, then (once they are on disk) its metadata."""
    from ckpt_cli.core.write.item import ItemWriter

    item = ItemWriter(
        dest,
        use_ocdbt=plan.write.ocdbt,
        use_zarr3=bool(plan.write.zarr3),
        # TensorStore holds about three times each block it encodes, over the ~90 MiB the
        # process starts with: blocks get three quarters of a writer's share, so the
        # default limit of 256 MiB keeps peak RSS under 300 MB.
        memory_limit=plan.write.memory_limit * 3 // 4,
        finite_label=None if plan.write.allow_nonfinite else plan.source,
    )
    expect = _carried(plan)
    item.write_arrays(outs, on_bytes, expect)
    item.write_metadata(outs)
    if expect:
        from ckpt_cli.core.digest.filesums import record_digests
        from ckpt_cli.core.digest.records import LeafDigest

        dtypes = {leaf.name: (leaf.expr.dtype, leaf.expr.shape) for leaf in plan.leaves}
        record_digests(
            dest, {n: LeafDigest(*dtypes[n], None, digest) for n, digest in expect.items()}
        )


def _carried(plan: ImportPlan) -> dict[str, str]:
    """Leaf name -> the ``ckpt.ld1`` digest of the tensor it takes unchanged (checked as the
    blocks are written, then recorded in the item: ``verify --deep`` checks them)."""
    from ckpt_cli.core.safetensors.ld1 import decode
    from ckpt_cli.core.safetensors.tensor_source import TensorSource

    digests = decode(plan.source_metadata)
    return {
        leaf.name: digests[leaf.expr.tensor]
        for leaf in plan.leaves
        if isinstance(leaf.expr, TensorSource) and leaf.expr.tensor in digests
    }


def _history(plan: ImportPlan) -> dict[str, Any]:
    """What the new step records in its ckpt_history."""
    return {
        "operation": "import",
        "source": plan.source,
        "files": list(plan.files),
        "safetensors_metadata": plan.source_metadata,
        "spec_file": plan.spec.path if plan.spec else None,
        "spec_sha256": plan.spec.sha256 if plan.spec else None,
    }


def _reader(expr: ops.Node, ctx: ImportContext) -> Any:
    whole = frozenset(id(n) for n in expr.walk() if n.whole)

    def read(region: ops.Region) -> Any:
        ctx.begin(whole)
        return expr.fetch(region, ctx)

    return read


def _step_name(root: Location, step: int, exported: str | None = None) -> str:
    """``step`` named as the root's newest step is (its prefix and zero padding, one listing
    of the root): a CheckpointManager opened with the root's naming options sees the import.
    In a root without steps, named as the exported step was (``exported``, recorded by
    ``ckpt export``: Kauldron's ``ckpt_4`` gives ``ckpt_N``)."""
    from ckpt_cli.core.format.names import parse_step_name, step_dir_name

    named = [
        (parsed.step, e.name)
        for e in (root.list() if root.exists() else [])
        if e.is_dir and (parsed := parse_step_name(e.name)) is not None and not parsed.tmp
    ]
    return step_dir_name(step, max(named)[1] if named else exported)
