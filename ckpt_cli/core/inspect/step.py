"""``inspect_path``: a path resolved to the item asked for, else to its step's one state item
(the others listed with it), else every item of the step; the training state judged across
every item of the step (``step_state.training_state``): the step is its unit."""

from __future__ import annotations

from dataclasses import replace

from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.names import (
    METRICS_ITEM,
    parse_step_name,
)
from ckpt_cli.core.format.resolve import resolve_item, resolve_items
from ckpt_cli.core.format.sharding import (
    ShardLayout,
    shard_layout,
)
from ckpt_cli.core.inspect import InspectResult, ItemReport, StepInspection
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.stats import leaves_stats
from ckpt_cli.core.step_state import (
    TrainingState,
    training_state,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import (
    CkptError,
    NotACheckpointError,
    NotFoundError,
    SeveralItemsError,
    UsageError,
)


def inspect_path(
    location: Location,
    step: int | None = None,
    item: str | None = None,
    *,
    name_filter: str | None = None,
    stats: bool = False,
    layout: str | None = None,
    on_progress: ProgressFn | None = None,
) -> InspectResult | StepInspection:
    """Resolve ``location`` to its item and inspect it: ``stats`` reads every array (progress
    as ``stats`` bytes), ``layout`` names the leaf whose device blocks to lay out. Without
    ``item`` on a step of several items none of which is the state item, every item."""
    try:
        return _inspect_path(location, step, item, name_filter, stats, layout, on_progress)
    except NotACheckpointError as e:
        parsed = parse_step_name(location.name)
        if parsed is None or not parsed.tmp:
            raise
        # A save still being written (or abandoned) may have no items yet, or items half
        # written: what the directory is says more than what it lacks. A tmp dir whose items
        # were all written stays readable (a crashed save can be looked at before cleaning).
        raise NotACheckpointError(
            f"{location} is an unfinished save of step {parsed.step}",
            hint="wait for the save to finish, or remove it with `ckpt prune --clean-tmp`",
        ) from e


def _inspect_path(
    location: Location,
    step: int | None,
    item: str | None,
    name_filter: str | None,
    stats: bool,
    layout: str | None,
    on_progress: ProgressFn | None,
) -> InspectResult | StepInspection:
    try:
        ref = resolve_item(location, step, item)
    except SeveralItemsError:
        if layout is not None:
            raise UsageError(
                "--layout lays out a leaf of one item, and this step holds several",
                hint="choose the item with --item NAME",
            ) from None
        refs = [r for r in resolve_items(location, step) if r.name != METRICS_ITEM]
        results = [_inspect(r, name_filter, stats, None, on_progress, False) for r in refs]
        verdict = _verdict([r.report for r in results], refs[0])
        return StepInspection(
            tuple(replace(r, report=replace(r.report, training=verdict)) for r in results)
        )
    result = _inspect(ref, name_filter, stats, layout, on_progress, must_match=True)
    # Without --item the step's other items are named (an unreadable one fails, as it would
    # alone); with --item they only complete the verdict, and one that cannot be read is left
    # out of it rather than failing the item asked for.
    siblings = _siblings(ref, strict=item is None)
    report = replace(result.report, training=_verdict([result.report, *siblings], ref))
    return InspectResult(report, result.stats, result.layout, () if item else tuple(siblings))


def with_training_state(report: ItemReport) -> ItemReport:
    """``report`` with the verdict on its step's training state, across the step's items (what
    ``ckpt inspect`` shows); a sibling item that cannot be read is left out of it."""
    return replace(report, training=_verdict([report, *_siblings(report.ref, False)], report.ref))


def _siblings(ref: ItemRef, strict: bool) -> list[ItemReport]:
    """The other items of ``ref``'s step, ``metrics`` aside."""
    if ref.step_location is None or ref.step_location == ref.location:
        return []
    try:
        refs = resolve_items(ref.step_location)
    except CkptError:
        if strict:
            raise
        return []
    out = []
    for r in refs:
        if r.name in (ref.name, METRICS_ITEM):
            continue
        try:
            out.append(inspect_item(r))
        except CkptError:
            if strict:
                raise
    return out


def _verdict(reports: list[ItemReport], ref: ItemRef) -> TrainingState:
    """The training state of ``ref``'s step across its items' ``reports``; of ``ref``'s item
    alone when it is no step's (a Checkpointer's save)."""
    if ref.step is None:
        main = next(r for r in reports if r.ref.name == ref.name)
        return training_state([main.item_parts], None, scope="item")
    ordered = sorted(reports, key=lambda r: r.ref.name)
    return training_state([r.item_parts for r in ordered], ref.step, scope="step")


def _inspect(
    ref: ItemRef,
    name_filter: str | None,
    stats: bool,
    layout: str | None,
    on_progress: ProgressFn | None,
    must_match: bool,
) -> InspectResult:
    report = inspect_item(ref, name_filter)
    if must_match and name_filter is not None and not report.leaves:
        raise NotFoundError(
            f"no leaf of {ref.location} matches {name_filter!r}",
            hint="run `ckpt inspect --flat` to see the leaf names",
        )
    values = None
    if stats:
        arrays = [(lf.name, lf.array, lf.database) for lf in report.leaves if lf.array is not None]
        store = ItemStore(ref.location, report.zarr_format == 3)
        values = leaves_stats(store, arrays, on_progress)
    return InspectResult(report, values, _layout_of(report, layout) if layout else None)


def _layout_of(report: ItemReport, name: str) -> ShardLayout:
    leaf = next((lf for lf in report.leaves if lf.name == name), None)
    if leaf is None:
        raise NotFoundError(
            f"--layout: no leaf named {name!r} in {report.ref.location}",
            hint="run `ckpt inspect --flat` to see the leaf names",
        )
    if leaf.shape is None:
        raise UsageError(f"--layout: {name!r} is a {leaf.value_type}, not an array")
    return shard_layout(leaf.shape, leaf.sharding, name)
