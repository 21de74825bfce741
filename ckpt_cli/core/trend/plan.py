"""Plan ``trend``: the committed steps a selection names, the item at each, and its leaves.

Only metadata is read here (per step: the listing, the tree metadata and the zarr headers);
``run.trend`` reads the values.
"""

from __future__ import annotations

import os
from dataclasses import replace

from ckpt_cli.core.digest.records import recorded_values
from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.discovery import detect
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.listing import StepInfo, list_root
from ckpt_cli.core.step_ranges import parse_steps
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.trend.types import LeafPlan, StepRead, TrendOptions, TrendPlan
from ckpt_cli.errors import NotFoundError


def plan_trend(
    path: str | os.PathLike[str] | Location,
    options: TrendOptions | None = None,
    *,
    storage: StorageOptions | None = None,
) -> TrendPlan:
    """What ``trend`` reads for a root (its committed steps, or those ``options.steps`` names),
    a step or an item directory (one step); raises ``UsageError`` on a bad selection and
    ``NotFoundError`` when nothing matches."""
    options = options or TrendOptions()
    location = path if isinstance(path, Location) else open_location(os.fspath(path), storage)
    selection = parse_steps(options.steps) if options.steps is not None else None
    found = detect(location)
    reads: list[StepRead] = []
    if found.kind == "root":
        infos = _selected(list_root(location, detected=found).steps, options.steps)
        for info in infos:
            ref = resolve_item(location, info.step, options.item)
            reads.append(StepRead(info.step, ref, info.metrics))
    else:
        ref = resolve_item(location, None, options.item)
        step = ref.step if ref.step is not None else 0
        if selection is not None and not selection.matches(step):
            raise NotFoundError(
                f"{location} holds step {step}, which --steps {options.steps} does not name",
                hint="give the root of the run to choose among its steps",
            )
        metrics = None
        if ref.step_location is not None and found.kind == "step":
            listing = list_root(location, detected=found)
            metrics = listing.steps[0].metrics if listing.steps else None
        reads.append(StepRead(step, ref, metrics))
    reads, leaves = _leaves(reads, options.match, not options.read_all)
    if not leaves:
        what = f"matches {options.match!r}" if options.match else "is an array"
        raise NotFoundError(
            f"no leaf of {reads[0].ref.location} {what}",
            hint="run `ckpt inspect --flat` to see the leaf names",
        )
    return TrendPlan(str(location), reads[0].ref.name, tuple(reads), leaves, options)


def _selected(steps: tuple[StepInfo, ...], text: str | None) -> list[StepInfo]:
    committed = [s for s in steps if s.status == "committed"]
    if text is not None:
        sel = parse_steps(text)
        missing = [n for n in sel.singles if n not in {s.step for s in committed}]
        if missing:
            raise NotFoundError(
                f"--steps {text}: step {missing[0]} is not a committed step of the root",
                hint="run `ckpt ls` to see the steps",
            )
        committed = [s for s in committed if sel.matches(s.step)]
    if not committed:
        raise NotFoundError(
            "no committed step" + (f" matches --steps {text}" if text else " in the root"),
            hint="run `ckpt ls` to see the steps",
        )
    return sorted(committed, key=lambda s: s.step)


def _leaves(
    reads: list[StepRead], match: str | None, records: bool
) -> tuple[list[StepRead], tuple[LeafPlan, ...]]:
    """The steps with their zarr format (and recorded digests when ``records``), and every
    numeric array leaf matching ``match``, in the order of the first step holding it, with its
    array at each step."""
    order: dict[str, tuple[str | None, str, tuple[int, ...]]] = {}
    at: dict[str, list[tuple[int, ArrayInfo, str]]] = {}
    done = []
    for read in reads:
        report = inspect_item(read.ref, match)
        digests = recorded_values(read.ref.location) if records and len(reads) > 1 else {}
        done.append(replace(read, zarr3=report.zarr_format == 3, digests=digests))
        for leaf in report.leaves:
            if leaf.array is None or leaf.random_key_impl or leaf.dtype is None:
                continue
            order.setdefault(leaf.name, (leaf.part, leaf.dtype, tuple(leaf.array.shape)))
            at.setdefault(leaf.name, []).append((read.step, leaf.array, leaf.database))
    return done, tuple(
        LeafPlan(name, part, dtype, shape, tuple(at[name]))
        for name, (part, dtype, shape) in order.items()
    )
