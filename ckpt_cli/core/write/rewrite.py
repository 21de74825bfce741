"""Write a new step from a source step: one item rewritten leaf by leaf, the others copied.

Shared by ``reshard`` and ``migrate``. The destination is a CheckpointManager root (created when
missing); the step keeps its number and is written under a tmp name, renamed when complete and
removed if anything fails, so a failed run never leaves a valid-looking step. The source is only
read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.executor import Executor
from ckpt_cli.core.format.digests import (
    DigestRecord,
    LeafDigest,
    file_checksum,
    recorded_file,
    write_digests,
)
from ckpt_cli.core.format.layout import ItemRef, detect, step_items
from ckpt_cli.core.format.metadata import read_step_metadata, read_tree_metadata
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.distributed import DEFAULT_UNIT_BYTES, ScaleStats, write_arrays_scaled
from ckpt_cli.core.write.item import JSON_HANDLER, STANDARD_HANDLER, ItemWriter
from ckpt_cli.core.write.step import StepWriter
from ckpt_cli.core.write.types import LeafOut
from ckpt_cli.errors import CkptError, NotACheckpointError, UsageError


@dataclass(frozen=True)
class StepOutput:
    path: str
    step: int
    item: str
    bytes_written: int
    scale: ScaleStats | None = None  # how a scaled-out run split the work


def prepare_destination(dst: Location, src: ItemRef) -> None:
    """Refuse a destination that is the source, lies inside it, or is something else."""
    if src.root is not None and (
        str(dst) == str(src.root) or str(dst).startswith(str(src.root) + "/")
    ):
        raise UsageError(
            f"the destination {dst} lies inside the source root {src.root}",
            hint="write to a new directory; ckpt never modifies its source",
        )
    if not dst.exists():
        return
    if not dst.is_dir():
        raise NotACheckpointError(f"the destination {dst} is a file")
    if not dst.list():
        return
    kind = detect(dst).kind
    if kind != "root":
        raise NotACheckpointError(
            f"the destination {dst} exists and is not a checkpoint root",
            hint="give a new directory or an existing CheckpointManager root",
        )


def write_step(
    src: ItemRef,
    dst: Location,
    leaves: Sequence[LeafOut],
    *,
    use_ocdbt: bool,
    use_zarr3: bool,
    memory_limit: int,
    operation: dict[str, Any],
    on_bytes: Callable[[int], None] | None = None,
    leaf_digests: dict[str, LeafDigest] | None = None,
    step: int | None = None,
    executor: Executor | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> StepOutput:
    """Write ``leaves`` as step ``step`` (default: the source's number) of the root ``dst``;
    ``leaf_digests`` (values known unchanged, e.g. by reshard) are recorded for the new item
    with freshly computed file checksums, so verify keeps checking them. With ``executor`` the
    arrays are written in units by its workers (``core/scale.py``); metadata, digests and the
    commit stay here, after every unit succeeded."""
    prepare_destination(dst, src)
    dst.make_dirs()
    if step is None:
        step = src.step if src.step is not None else 0
    writer = StepWriter(dst, str(step))
    writer.begin()
    try:
        source_meta = read_step_metadata(src.step_location) if src.step_location else None
        item_dir = writer.item(src.name, STANDARD_HANDLER)
        tree = read_tree_metadata(src.location)
        item = ItemWriter(
            item_dir, use_ocdbt=use_ocdbt, use_zarr3=use_zarr3, memory_limit=memory_limit
        )
        stats = None
        if executor is None:
            item.write_arrays(leaves, on_bytes)
        else:
            stats = write_arrays_scaled(item, leaves, executor, unit_bytes, on_bytes)
        item.write_metadata(leaves, tree.custom_metadata if tree else None)
        if leaf_digests:
            files = {
                rel: file_checksum(item_dir.child(*rel.split("/")))
                for rel, _ in item_dir.walk()
                if recorded_file(rel)
            }
            write_digests(item_dir, DigestRecord(leaf_digests, files))
        if src.step_location is not None and src.location != src.step_location:
            _copy_other_items(src, writer, source_meta.item_handlers if source_meta else None)
        custom = dict(source_meta.custom_metadata or {}) if source_meta else {}
        history = (
            list(custom.get("ckpt_history", []))
            if isinstance(custom.get("ckpt_history"), list)
            else []
        )
        custom["ckpt_history"] = [*history, {**operation, "source": str(src.location)}]
        final = writer.commit(custom, source_meta.metrics if source_meta else None)
    except BaseException:
        # Interrupts included: a dead run must leave no tmp step that a retry trips over.
        with contextlib.suppress(CkptError):
            writer.abort()
        raise
    written = sum(leaf.array.nbytes for leaf in leaves if leaf.array is not None)
    return StepOutput(str(final), step, src.name, written, stats)


def _copy_other_items(
    src: ItemRef, writer: StepWriter, handlers: dict[str, str] | str | None
) -> None:
    assert src.step_location is not None
    children = src.step_location.list()
    for name in step_items(src.step_location, children, handlers):
        if name == src.name:
            continue
        handler = handlers.get(name, JSON_HANDLER) if isinstance(handlers, dict) else JSON_HANDLER
        src.step_location.child(name).copy_tree(writer.item(name, handler))
