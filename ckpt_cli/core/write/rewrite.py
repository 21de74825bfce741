"""Write a new step from a source step: some items rewritten leaf by leaf, the others copied.

Shared by ``reshard`` and ``migrate``. The destination is a CheckpointManager root (created when
missing); the step keeps its number and is written under a tmp name, renamed when complete and
removed if anything fails, so a failed run never leaves a valid-looking step. The source is only
read.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypedDict

from typing_extensions import NotRequired, TypeVar

from ckpt_cli.core.digest.filesums import record_digests
from ckpt_cli.core.digest.records import (
    BlockDigests,
    LeafDigest,
)
from ckpt_cli.core.executor import Executor, decline, open_executor
from ckpt_cli.core.format.discovery import ItemRef, detect
from ckpt_cli.core.format.items import handler_kind, step_handler
from ckpt_cli.core.format.metadata import (
    StepMetadata,
    read_step_metadata,
    read_tree_metadata,
)
from ckpt_cli.core.format.names import (
    ROOT_METADATA_DIR,
    STEP_METADATA,
    check_plain_name,
    step_dir_name,
)
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.split import should_split
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.distributed import (
    DEFAULT_UNIT_BYTES,
    ScaleJSON,
    ScaleStats,
    write_arrays_scaled,
)
from ckpt_cli.core.write.item import (
    HANDLERS,
    STANDARD_HANDLER,
    ItemWriter,
)
from ckpt_cli.core.write.other_items import copy_other_items
from ckpt_cli.core.write.step import StepWriter
from ckpt_cli.core.write.types import LeafOut, WriteOptions
from ckpt_cli.errors import (
    CkptError,
    NotACheckpointError,
    UsageError,
)


@dataclass(frozen=True)
class StepOutput:
    path: str
    step: int
    item: str
    bytes_written: int
    scale: ScaleStats | None = None  # how a scaled-out run split the work
    items: tuple[str, ...] = ()  # every item rewritten (``item`` is the first)
    #: (item, leaf) whose version-1 (SHA-256) digest was carried without being checked: its
    #: values were not written as one C-order stream (chunks that split rows, several units).
    unchecked: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ItemOut:
    """One item a writer rewrites: its source item, its output leaves, the digests of values
    known unchanged (recorded with fresh file checksums) and its kind (``pytree``/``array``)."""

    source: ItemRef
    leaves: Sequence[LeafOut]
    leaf_digests: dict[str, LeafDigest] | None = None
    kind: str = "pytree"
    #: Leaf name -> ``ld1`` its written values must have (besides ``leaf_digests``' own).
    expect: Mapping[str, str] | None = None


class UncheckedJSON(TypedDict):
    """A leaf whose version-1 (SHA-256) digest was carried to the new step unchecked."""

    item: str
    leaf: str


class WrittenJSON(TypedDict):
    """What a writer adds to its plan's document once the step is written."""

    output: NotRequired[str]
    step: NotRequired[int]
    item: NotRequired[str]
    written_items: NotRequired[list[str]]
    bytes_written: NotRequired[int]
    seconds: NotRequired[float]
    scale: NotRequired[ScaleJSON | None]
    unchecked_digests: NotRequired[list[UncheckedJSON]]
    digests: NotRequired[str]


#: The document of a written step (``ReshardJSON``, ``MigrateJSON``): the writer's plan knows it.
DocumentT = TypeVar("DocumentT", covariant=True, default=Mapping[str, Any])


class WritePlan(Protocol[DocumentT]):
    """A frozen plan of a writer (``ReshardPlan``, ``MigrationPlan``)."""

    @property
    def kind(self) -> str: ...

    def written_json(self, written: WrittenJSON) -> DocumentT:
        """The plan's document with ``written`` added."""
        ...


@dataclass(frozen=True)
class WriteResult(Generic[DocumentT]):
    """A written step: the plan it carried out, where it went, how long it took; ``digests``
    says whether the new step's digests were recorded (migrate), None when not asked."""

    plan: WritePlan[DocumentT]
    output: StepOutput
    seconds: float
    digests: str | None = None

    @property
    def rate(self) -> float:
        """Bytes written per second."""
        return self.output.bytes_written / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> DocumentT:
        """The plan's document, with what was written added."""
        out = self.output
        written: WrittenJSON = {
            "output": out.path,
            "step": out.step,
            "item": out.item,
            "written_items": list(out.items or (out.item,)),
            "bytes_written": out.bytes_written,
            "seconds": round(self.seconds, 3),
            "scale": out.scale.to_json() if out.scale else None,
            "unchecked_digests": [{"item": i, "leaf": leaf} for i, leaf in out.unchecked],
        }
        if self.digests is not None:
            written["digests"] = self.digests
        return self.plan.written_json(written)


def run_write(
    items: Sequence[ItemOut],
    dst: Location,
    options: WriteOptions,
    *,
    zarr3: bool,
    label: str,
    operation: dict[str, Any],
    on_progress: ProgressFn | None = None,
    step: int | None = None,
    skip_items: frozenset[str] = frozenset(),
    sources: str | None = None,
) -> tuple[StepOutput, float]:
    """``write_items`` with ``options`` (``zarr3``: the output zarr version, resolved): the
    executor opened when it scales out, progress as ``label`` bytes of the arrays; NaN/Inf
    refused unless ``options.allow_nonfinite``, the error naming ``sources`` (default: the
    source step). Returns the output and the seconds it took."""
    started = time.monotonic()
    total = sum(_array_bytes(item.leaves) for item in items)
    declined = _declined_split(items, dst, options, total)
    with contextlib.ExitStack() as stack:
        executor = None
        if options.executor.scaled and declined is None:
            executor = stack.enter_context(open_executor(options.executor))
        out = write_items(
            items,
            dst,
            use_ocdbt=options.ocdbt,
            use_zarr3=zarr3,
            memory_limit=options.memory_limit,
            operation=operation,
            on_bytes=ByteProgress(on_progress, label, total),
            step=step,
            executor=executor,
            unit_bytes=options.unit_bytes,
            check_destination=False,
            skip_items=skip_items,
            finite_label=None if options.allow_nonfinite else (sources or _source_of(items)),
        )
    if declined is not None:
        out = replace(out, scale=declined)
    return out, time.monotonic() - started


def _layout(
    use_ocdbt: bool, use_zarr3: bool, memory_limit: int, finite_label: str | None
) -> dict[str, Any]:
    """The keyword arguments of each item's ``ItemWriter``."""
    return dict(
        use_ocdbt=use_ocdbt,
        use_zarr3=use_zarr3,
        memory_limit=memory_limit,
        finite_label=finite_label,
    )


def _source_of(items: Sequence[ItemOut]) -> str:
    """The source step as an error names it: ``step 5 of /runs/exp7``."""
    src = items[0].source
    where = src.root or src.step_location or src.location
    return f"step {src.step} of {where}" if src.step is not None else str(src.location)


def _declined_split(
    items: Sequence[ItemOut], dst: Location, options: WriteOptions, total: int
) -> ScaleStats | None:
    """The scale block of a scaled-out run that stays in one process (``should_split``: the
    transfer is too short for the workers' start-up to pay), its early pool released; None
    when the run is not scaled out or splits."""
    from ckpt_cli.core.storage.remote import RemoteLocation

    spec = options.executor
    if not spec.scaled:
        return None
    places = [dst, *(i.source.location for i in items)]
    decision = should_split(spec, total, remote=any(isinstance(p, RemoteLocation) for p in places))
    if decision.split:
        return None
    decline(spec)
    return ScaleStats(spec.kind, spec.workers, 0, 0, 0.0, 0.0, False, decision.reason)


def _array_bytes(leaves: Sequence[LeafOut]) -> int:
    return sum(leaf.array.nbytes for leaf in leaves if leaf.array is not None)


def prepare_destination(dst: Location, src: ItemRef) -> None:
    """Refuse a destination that is the source, lies inside it, or is something else."""
    if src.root is not None and (
        str(dst) == str(src.root) or str(dst).startswith(str(src.root) + "/")
    ):
        raise UsageError(
            f"the destination {dst} lies inside the source root {src.root}",
            hint="write to a new directory; ckpt never modifies its source",
        )
    check_destination_root(dst)


def check_new_step(dst: Location, src: ItemRef, step: int | None = None) -> None:
    """What writing ``src`` as step ``step`` (default: the source's number) of the root
    ``dst`` would refuse about the destination, checked when the plan is made, so that a
    refusal comes before any plan is shown: a destination ``prepare_destination`` refuses, a
    step of the new step's name already there. ``write_items`` checks again as it writes."""
    prepare_destination(dst, src)
    if step is None:
        step = src.step if src.step is not None else 0
    refusal = _step_writer(src, dst, step, {}).refusal()
    if refusal is not None:
        raise refusal


def check_destination_root(dst: Location) -> None:
    """Refuse a destination that exists and is neither empty nor a CheckpointManager root."""
    if not dst.exists():
        return
    if not dst.is_dir():
        raise NotACheckpointError(f"the destination {dst} is a file")
    if not [e for e in dst.list() if not e.name.startswith(".ckpt-")]:
        return  # empty, or only ckpt's own hidden files (a lock left by a killed writer)
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
    leaf_digests: dict[str, LeafDigest] | None = None,
    item_kind: str = "pytree",
    **options: Any,
) -> StepOutput:
    """``write_items`` of the one item ``src`` rewritten as ``leaves``."""
    return write_items([ItemOut(src, leaves, leaf_digests, item_kind)], dst, **options)


def write_items(
    items: Sequence[ItemOut],
    dst: Location,
    *,
    use_ocdbt: bool,
    use_zarr3: bool,
    memory_limit: int,
    operation: dict[str, Any],
    on_bytes: Callable[[int], None] | None = None,
    step: int | None = None,
    executor: Executor | None = None,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
    check_destination: bool = True,
    skip_items: frozenset[str] = frozenset(),
    finite_label: str | None = None,
) -> StepOutput:
    """Write ``items`` (of one source step) as step ``step`` (default: the source's number) of
    the root ``dst``, named as the source step is (``step_dir_name``), its other items copied;
    one commit. An item's ``leaf_digests`` (values known unchanged, e.g. by reshard) are
    recorded with fresh file checksums, so verify keeps checking them; its ``kind`` picks its
    handler. With ``executor`` the arrays are written in units by its workers; metadata,
    digests and the commit stay here. ``check_destination`` False: the caller already did.
    ``skip_items``: items of the source step left out of the new step (not copied)."""
    src = items[0].source
    assert all(i.source.step_location == src.step_location for i in items), "one source step"
    if check_destination:
        prepare_destination(dst, src)
    if step is None:
        step = src.step if src.step is not None else 0
    # A step that is its own item (flax.training.checkpoints) stays one: its readers restore
    # the step directory itself and find no tree in an item directory.
    top = len(items) == 1 and src.step is not None and src.location == src.step_location
    writer = _step_writer(src, dst, step, operation)
    writer.begin()
    try:
        source_meta = read_step_metadata(src.step_location) if src.step_location else None
        layout = _layout(use_ocdbt, use_zarr3, memory_limit, finite_label)
        handlers = source_meta.item_handlers if source_meta else None
        stats, records, unchecked = _write_each(
            items, writer, top, layout, executor, unit_bytes, on_bytes, handlers
        )
        # At the step top the record covers the step's _CHECKPOINT_METADATA too: written last.
        for record in records if not top else ():
            record()
        if src.step_location is not None and src.location != src.step_location:
            handlers = source_meta.item_handlers if source_meta else None
            skip = {i.source.name for i in items} | skip_items
            copy_other_items(src, writer, handlers, memory_limit, skip)
        custom = _with_history(source_meta, {**operation, "source": str(src.location)})
        metrics = source_meta.metrics if source_meta else None
        final = writer.commit(custom, metrics, before_marker=records[0] if top else None)
    except BaseException:
        # Interrupts included: a dead run must leave no tmp step that a retry trips over.
        with contextlib.suppress(CkptError):
            writer.abort()
        raise
    carry_root_metadata(src.root, dst)
    written = sum(_array_bytes(one.leaves) for one in items)
    names = tuple(i.source.name for i in items)
    return StepOutput(str(final), step, src.name, written, _merged(stats), names, tuple(unchecked))


def carry_root_metadata(src_root: Location | None, dst: Location) -> None:
    """The source root's ``metadata/`` (``_ROOT_METADATA``: a manager's or the v1
    Checkpointer's custom metadata) copied as it is into a destination root that has none;
    written after the step, so a failed write leaves no root behind for it."""
    if src_root is None:
        return
    source = src_root.child(ROOT_METADATA_DIR)
    target = dst.child(ROOT_METADATA_DIR)
    if source.is_symlink() or not source.is_dir() or target.exists():
        return
    if any(entry.is_symlink for _, entry in source.walk()):
        return  # never a link or what it points to (verify reports it)
    source.copy_tree(target)


def _write_each(
    items: Sequence[ItemOut],
    writer: Any,
    top: bool,
    layout: dict[str, Any],
    executor: Executor | None,
    unit_bytes: int,
    on_bytes: Callable[[int], None] | None,
    handlers: dict[str, str] | str | None = None,
) -> tuple[list[ScaleStats | None], list[Callable[[], None]], list[tuple[str, str]]]:
    """Write each item's arrays into ``writer``'s step: the scale figures per item, the digest
    records to write once every item is written, and the (item, leaf) pairs whose version-1
    digest was carried unchecked. An item keeps the handler its source step recorded when
    that handler writes items of its kind (PyTreeCheckpointHandler, the v1 PyTreeHandler):
    a loader that picks the handler from the step's metadata finds the same one."""
    stats: list[ScaleStats | None] = []
    records: list[Callable[[], None]] = []
    unchecked: list[tuple[str, str]] = []
    for one in items:
        recorded = step_handler(handlers, one.source.name)
        handler = (
            recorded
            if recorded is not None and handler_kind(recorded) == one.kind
            else HANDLERS.get(one.kind, STANDARD_HANDLER)
        )
        item_dir = writer.top_item(handler) if top else writer.item(one.source.name, handler)
        item = ItemWriter(item_dir, **layout)
        scale, not_checked = _write_leaves(item, one, executor, unit_bytes, on_bytes)
        stats.append(scale)
        unchecked += [(one.source.name, leaf) for leaf in not_checked]
        records.append(functools.partial(record_digests, item_dir, one.leaf_digests, executor))
    return stats, records, unchecked


def _merged(stats: list[ScaleStats | None]) -> ScaleStats | None:
    """The scale-out figures of a step's items added up (None: not scaled out)."""
    done = [s for s in stats if s is not None]
    if len(done) <= 1:
        return done[0] if done else None
    return replace(
        done[0],
        units=sum(s.units for s in done),
        databases=sum(s.databases for s in done),
        worker_seconds=sum(s.worker_seconds for s in done),
        merge_seconds=sum(s.merge_seconds for s in done),
    )


def _write_leaves(
    item: ItemWriter,
    one: ItemOut,
    executor: Executor | None,
    unit_bytes: int,
    on_bytes: Callable[[int], None] | None,
) -> tuple[ScaleStats | None, list[str]]:
    """The item's arrays (by ``executor``'s workers when given), then its tree metadata.
    Returns the scale-out figures and the leaves whose version-1 digest went unchecked."""
    src, leaves = one.source, one.leaves
    stats = None
    expect = carried_digests(one)
    if executor is None:
        taken = item.write_arrays(leaves, on_bytes, expect)
    else:
        stats, taken = write_arrays_scaled(item, leaves, executor, unit_bytes, on_bytes, expect)
    tree = read_tree_metadata(src.location)
    item.write_metadata(leaves, tree.custom_metadata if tree else None)
    return stats, taken.unchecked


def carried_digests(one: ItemOut) -> BlockDigests:
    """What the writer checks while writing: every carried ``ld1``, and the SHA-256 of a leaf
    whose record is version 1 (checked where its blocks are written in C order)."""
    recorded = one.leaf_digests or {}
    expect = {k: d.ld1 for k, d in recorded.items() if d.ld1}
    expect |= one.expect or {}
    sha = {k: d.digest for k, d in recorded.items() if d.digest and k not in expect}
    return BlockDigests(expect, (), sha)


def _step_writer(src: ItemRef, dst: Location, step: int, operation: dict[str, Any]) -> StepWriter:
    """The writer of step ``step`` in ``dst``, named in the source step's form (``checkpoint_6``,
    ``0006``): Flax's restore_checkpoint and a CheckpointManager with a ``step_prefix`` or
    ``step_format_fixed_length`` see no other names. A source that is no step: plain ``N``.
    Refuses first a source step whose metadata names an item that is no plain name."""
    if src.step_location is not None:
        _check_item_names(src.step_location)
    like = src.step_location.name if src.step is not None and src.step_location else None
    return StepWriter(dst, step_dir_name(step, like), str(operation.get("operation", "ckpt")))


def _check_item_names(step_location: Location) -> None:
    """Refuse a source step whose metadata names an item that is no plain directory name."""
    handlers = read_step_metadata(step_location).item_handlers
    for name in handlers if isinstance(handlers, dict) else ():
        check_plain_name(name, "item name", step_location.child(STEP_METADATA))


def _with_history(source_meta: StepMetadata | None, entry: dict[str, Any]) -> dict[str, Any]:
    """The source step's custom metadata, ``entry`` added to its ``ckpt_history``."""
    custom = dict(source_meta.custom_metadata or {}) if source_meta else {}
    history = (
        list(custom.get("ckpt_history", [])) if isinstance(custom.get("ckpt_history"), list) else []
    )
    custom["ckpt_history"] = [*history, entry]
    return custom
