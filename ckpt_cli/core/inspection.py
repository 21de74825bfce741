"""What ``ckpt inspect`` shows for a path: one item, and what else its step holds.

A path resolves to the item asked for (``--item``), else to its step's one state item (the only
one besides ``metrics``, or the only PyTree among JSON and ArraySave items); the other items of
that step are listed with it. When no item is the obvious one (two PyTree items), every item of
the step is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.layout import ItemRef
from ckpt_cli.core.format.names import METRICS_ITEM
from ckpt_cli.core.format.resolve import resolve_item, resolve_items
from ckpt_cli.core.format.sharding import ShardLayout, shard_layout
from ckpt_cli.core.inspect import InspectJSON, ItemReport, OtherItemJSON, inspect_item
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.stats import LeafStats, leaves_stats
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import NotFoundError, SeveralItemsError, UsageError


@dataclass(frozen=True)
class InspectResult:
    """What ``ckpt inspect`` shows: the item, with per-leaf statistics (``--stats``) and the
    block layout of one leaf (``--layout``) when asked, and the step's other items."""

    report: ItemReport
    stats: dict[str, LeafStats] | None = None
    layout: ShardLayout | None = None
    others: tuple[ItemReport, ...] = ()

    def to_json(self) -> InspectJSON:
        doc = self.report.to_json()
        if self.stats is not None:
            for leaf_doc in doc["leaves"]:
                s = self.stats.get(leaf_doc["name"])
                leaf_doc["stats"] = s.to_json() if s else None
        if self.layout is not None:
            doc["layout"] = self.layout.to_json()
        doc["other_items"] = [summary(r) for r in self.others]
        return doc


class StepInspectJSON(TypedDict):
    """``ckpt inspect --json`` of a step of several items none of which is the state item (two
    PyTree items, no ``--item``): every item, each as the one-item document."""

    schema_version: int
    ok: bool
    path: str
    root: str | None
    step: int | None
    item: None
    items: list[InspectJSON]


@dataclass(frozen=True)
class StepInspection:
    """Every item of a step none of which is the obvious one to show alone."""

    items: tuple[InspectResult, ...]

    def to_json(self) -> StepInspectJSON:
        ref = self.items[0].report.ref
        return {
            "schema_version": ItemReport.SCHEMA_VERSION,
            "ok": True,
            "path": str(ref.step_location),
            "root": str(ref.root) if ref.root else None,
            "step": ref.step,
            "item": None,
            "items": [r.to_json() for r in self.items],
        }


def summary(report: ItemReport) -> OtherItemJSON:
    """One line's worth of an item: what ``other_items`` lists."""
    return {
        "item": report.ref.name,
        "kind": report.kind,
        "path": str(report.ref.location),
        "leaves": len(report.leaves),
        "size_bytes": report.total_bytes,
    }


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
        ref = resolve_item(location, step, item)
    except SeveralItemsError:
        if layout is not None:
            raise UsageError(
                "--layout lays out a leaf of one item, and this step holds several",
                hint="choose the item with --item NAME",
            ) from None
        refs = [r for r in resolve_items(location, step) if r.name != METRICS_ITEM]
        return StepInspection(
            tuple(
                _inspect(r, name_filter, stats, None, on_progress, must_match=False) for r in refs
            )
        )
    result = _inspect(ref, name_filter, stats, layout, on_progress, must_match=True)
    if item is None and ref.step_location is not None and ref.step_location != ref.location:
        others = tuple(
            inspect_item(r)
            for r in resolve_items(ref.step_location)
            if r.name not in (ref.name, METRICS_ITEM)
        )
        result = InspectResult(result.report, result.stats, result.layout, others)
    return result


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
