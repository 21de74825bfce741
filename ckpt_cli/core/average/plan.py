"""Plan an average: which leaves of which items are averaged, with which coefficients, and where
the new step goes.

``plan_average`` reads metadata only. The last step listed is the base: its items, tree, chunks
and sharding are the new step's, and every leaf that is not averaged is its value. A leaf is
averaged when it is a floating-point array (float16/32/64, bfloat16, float8), is no optimizer
state, RNG state or step counter, and matches ``--filter`` when one is given. Optimizer state is
carried from the base or dropped (``optimizer``). Coefficients: normalised ``weights`` (equal by
default), or with ``ema`` = d the exponential moving average over the steps in the order listed,
e_1 = x_1, e_k = d * e_(k-1) + (1 - d) * x_k, i.e. x_1 weighs d^(n-1), x_k (k >= 2) weighs
(1 - d) * d^(n-k).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypedDict

from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.names import compile_filter
from ckpt_cli.core.format.resolve import resolve_items, resolve_trees
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.migrate.plan import resolve_destination
from ckpt_cli.core.regex import Regex
from ckpt_cli.core.reshard.plan import ReshardLayout, plan_like
from ckpt_cli.core.state import telling_name
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.core.write.memory import bound_allocator
from ckpt_cli.core.write.rewrite import WrittenJSON, check_new_step
from ckpt_cli.core.write.types import WriteOptions
from ckpt_cli.errors import UsageError

Action = Literal["average", "last", "drop"]
OptimizerMode = Literal["carry", "drop"]
#: Parts whose values are never averaged: counters and keys are the last step's.
_NEVER_AVERAGED = frozenset({"opt_state", "rng", "step"})


class AverageLeafJSON(TypedDict):
    item: str
    name: str
    dtype: str | None
    shape: list[int] | None
    action: Action  # average: the mean of the steps; last: the last step's value; drop: left out
    size_bytes: int


class AveragePlanJSON(TypedDict):
    """The plan alone, as ``--dry-run`` prints it."""

    schema_version: int
    ok: bool
    steps: list[int]
    weights: list[float]  # the coefficient of each step (normalised, summing to 1)
    ema: float | None
    match: str | None
    optimizer: OptimizerMode
    step_out: int
    items: list[str]
    dropped_items: list[str]
    averaged_bytes: int
    total_bytes: int
    leaves: list[AverageLeafJSON]


class AverageJSON(AveragePlanJSON, WrittenJSON):
    """``ckpt average --json``: the plan per leaf, and what was written (not with --dry-run)."""


@dataclass(frozen=True)
class AverageItem:
    """One item of the base step: its report, the same item in every listed step (in order),
    the layout of its output (the base's chunks and sharding) and each leaf's action."""

    source: ItemRef
    report: ItemReport
    steps: tuple[tuple[ItemRef, ItemReport], ...]
    layout: ReshardLayout
    actions: tuple[Action, ...]

    def to_json(self) -> list[AverageLeafJSON]:
        return [
            {
                "item": self.source.name,
                "name": leaf.name,
                "dtype": leaf.dtype,
                "shape": None if leaf.shape is None else list(leaf.shape),
                "action": action,
                "size_bytes": leaf.size_bytes,
            }
            for leaf, action in zip(self.report.leaves, self.actions, strict=True)
        ]


@dataclass(frozen=True)
class AveragePlan:
    """An average to carry out (``execute``). Nothing has been written when a plan exists."""

    source: ItemRef  # the base step's first item
    items: tuple[AverageItem, ...]
    dropped_items: tuple[str, ...]  # optimizer items left out (``--optimizer drop``)
    steps: tuple[int, ...]
    coefficients: tuple[float, ...]
    ema: float | None
    match: str | None
    optimizer: OptimizerMode
    destination: Location
    step_out: int
    write: WriteOptions
    zarr3: bool

    kind = "average"
    SCHEMA_VERSION: ClassVar[int] = 1

    @property
    def averaged_bytes(self) -> int:
        return sum(
            leaf.size_bytes
            for item in self.items
            for leaf, action in zip(item.report.leaves, item.actions, strict=True)
            if action == "average"
        )

    @property
    def total_bytes(self) -> int:
        return sum(
            leaf.size_bytes
            for item in self.items
            for leaf, action in zip(item.report.leaves, item.actions, strict=True)
            if action != "drop" and leaf.is_array
        )

    @property
    def warnings(self) -> tuple[str, ...]:
        if self.averaged_bytes == 0:
            return ("no leaf is averaged: the new step is a copy of the last step listed",)
        return ()

    @property
    def operation(self) -> dict[str, Any]:
        """What the new step records in its ckpt_history: the steps and their coefficients."""
        return {
            "operation": "average",
            "steps": list(self.steps),
            "weights": list(self.coefficients),
            "ema": self.ema,
            "match": self.match,
            "optimizer": self.optimizer,
        }

    def to_json(self) -> AveragePlanJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "steps": list(self.steps),
            "weights": list(self.coefficients),
            "ema": self.ema,
            "match": self.match,
            "optimizer": self.optimizer,
            "step_out": self.step_out,
            "items": [item.source.name for item in self.items],
            "dropped_items": list(self.dropped_items),
            "averaged_bytes": self.averaged_bytes,
            "total_bytes": self.total_bytes,
            "leaves": [leaf for item in self.items for leaf in item.to_json()],
        }

    def written_json(self, written: WrittenJSON) -> AverageJSON:
        return {**self.to_json(), **written}


def coefficients(
    count: int, weights: Sequence[float] | None = None, ema: float | None = None
) -> tuple[float, ...]:
    """Each step's coefficient, summing to 1: ``weights`` normalised (equal when None), or the
    exponential moving average with decay ``ema`` over the steps in order."""
    if ema is not None:
        if weights is not None:
            raise UsageError("--weights and --ema are two ways to weigh the steps: give one")
        if not (math.isfinite(ema) and 0 < ema < 1):
            raise UsageError(f"--ema {ema}: the decay must lie strictly between 0 and 1")
        return tuple(
            ema ** (count - 1) if k == 0 else (1 - ema) * ema ** (count - 1 - k)
            for k in range(count)
        )
    if weights is None:
        return tuple(1 / count for _ in range(count))
    if len(weights) != count:
        raise UsageError(
            f"--weights gives {len(weights)} weights for {count} steps: give one per step"
        )
    bad = [w for w in weights if not (math.isfinite(w) and w > 0)]
    if bad:
        raise UsageError(f"--weights: {bad[0]} is not a positive number; every weight must be")
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def plan_average(
    source: str | os.PathLike[str] | Location,
    destination: str | os.PathLike[str] | Location,
    steps: Sequence[int],
    *,
    weights: Sequence[float] | None = None,
    ema: float | None = None,
    match: str | None = None,
    optimizer: str = "carry",
    item: str | None = None,
    step_out: int | None = None,
    write: WriteOptions | None = None,
    storage: StorageOptions | None = None,
) -> AveragePlan:
    """Plan averaging ``steps`` of the root ``source`` into the root ``destination`` (``ROOT/N``
    inside an existing root names the step; default number: the last step's). Reads metadata
    only; a leaf whose shape or dtype differs between the steps is a usage error naming it."""
    steps = _check_steps(steps)
    coef = coefficients(len(steps), weights, ema)
    if optimizer not in ("carry", "drop"):
        raise UsageError(f"--optimizer {optimizer!r}: use carry or drop")
    pattern = compile_filter(match)
    write = write or WriteOptions()
    bound_allocator()
    src = _open(source, storage)
    dest, out_step = resolve_destination(_open(destination, storage), step_out)
    per_step = [resolve_trees(src, s, item) for s in steps]
    base = per_step[-1]
    mode: OptimizerMode = "drop" if optimizer == "drop" else "carry"
    items, dropped = [], []
    for ref in base:
        if mode == "drop" and _optimizer_item(ref.name):
            dropped.append(ref.name)
            continue
        items.append(_plan_item(ref, per_step, steps, pattern, mode, write.max_chunk_bytes))
    if not items:
        raise UsageError(
            f"--optimizer drop leaves nothing of step {steps[-1]}: its items are "
            + ", ".join(r.name for r in base)
        )
    if mode == "drop" and item is not None:
        # The step's other items are copied: its optimizer items are not, as without --item.
        others = resolve_items(base[0].step_location or src) if base[0].step is not None else []
        dropped += [r.name for r in others if r.name != item and _optimizer_item(r.name)]
    check_new_step(dest, items[0].source, steps[-1] if out_step is None else out_step)
    report = items[0].report
    return AveragePlan(
        source=items[0].source,
        items=tuple(items),
        dropped_items=tuple(dropped),
        steps=steps,
        coefficients=coef,
        ema=ema,
        match=match,
        optimizer=mode,
        destination=dest,
        step_out=out_step if out_step is not None else steps[-1],
        write=write,
        zarr3=report.zarr_format == 3 if write.zarr3 is None else write.zarr3,
    )


def _check_steps(steps: Sequence[int]) -> tuple[int, ...]:
    if len(steps) < 2:
        raise UsageError("--steps: list at least two steps to average, e.g. --steps 400,500,600")
    seen = [s for i, s in enumerate(steps) if s in steps[:i]]
    if seen:
        raise UsageError(f"--steps lists step {seen[0]} twice; give each step once")
    return tuple(steps)


def _optimizer_item(name: str) -> bool:
    """An item that is optimizer state as a whole (flax.nnx's ``optimizer`` item)."""
    telling = telling_name((name,))
    return telling is not None and telling[0] == "opt_state"


def _plan_item(
    ref: ItemRef,
    per_step: list[list[ItemRef]],
    steps: tuple[int, ...],
    pattern: Regex | None,
    optimizer: OptimizerMode,
    max_chunk_bytes: int,
) -> AverageItem:
    """The base item's leaves with their actions; the same item of every step, checked."""
    report = inspect_item(ref)
    whole_optimizer = _optimizer_item(ref.name)
    actions: list[Action] = []
    for leaf in report.leaves:
        if leaf.part == "opt_state" or whole_optimizer:
            actions.append("drop" if optimizer == "drop" else "last")
        elif averaged(leaf, pattern):
            actions.append("average")
        else:
            actions.append("last")
    others = []
    for refs, step in zip(per_step[:-1], steps[:-1], strict=True):
        other = next((r for r in refs if r.name == ref.name), None)
        if other is None:
            raise UsageError(
                f"step {step} has no item {ref.name!r} (step {steps[-1]} has): "
                "these steps cannot be averaged; nothing written",
                hint="list steps saved by the same training run",
            )
        other_report = inspect_item(other)
        _check_same(report, other_report, actions, step, steps[-1])
        others.append((other, other_report))
    layout = plan_like(report, report, max_chunk_bytes)
    if optimizer == "drop":
        kept = [p for p, a in zip(layout.leaves, actions, strict=True) if a != "drop"]
        layout = replace(layout, leaves=tuple(kept))
    return AverageItem(ref, report, (*others, (ref, report)), layout, tuple(actions))


def averaged(leaf: Leaf, pattern: Regex | None) -> bool:
    """Whether a leaf's values are averaged: a float array of no counter/key/optimizer part,
    matching ``pattern`` when one is given."""
    if not leaf.is_array or leaf.dtype is None or leaf.random_key_impl:
        return False
    if not leaf.dtype.startswith(("float", "bfloat")) or leaf.part in _NEVER_AVERAGED:
        return False
    return pattern is None or pattern.search(leaf.name) is not None


def _check_same(
    base: ItemReport, other: ItemReport, actions: list[Action], step: int, last: int
) -> None:
    """Every averaged leaf of ``base`` is in ``other`` with the same dtype and shape."""
    theirs = {leaf.name: leaf for leaf in other.leaves}
    for leaf, action in zip(base.leaves, actions, strict=True):
        if action != "average":
            continue
        found = theirs.get(leaf.name)
        if found is None:
            why = f"is not in step {step}"
        elif found.dtype != leaf.dtype or found.shape != leaf.shape:
            why = (
                f"is {found.dtype}{list(found.shape or ())} in step {step} but "
                f"{leaf.dtype}{list(leaf.shape or ())} in step {last}"
            )
        else:
            continue
        where = f"item {base.ref.name}: " if base.ref.name not in ("default", "state") else ""
        raise UsageError(
            f"{where}leaf {leaf.name} {why}: these steps cannot be averaged; nothing written",
            hint="list steps of the same model, or --filter only the leaves they share",
        )


def _open(target: str | os.PathLike[str] | Location, storage: StorageOptions | None) -> Location:
    return target if isinstance(target, Location) else open_location(target, storage)


def parse_steps(text: str) -> list[int]:
    """``--steps 400,500,600``: step numbers in the order they are weighed."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(
            f"--steps {text!r}: give step numbers separated by commas, e.g. --steps 400,500,600"
        )
    return [int(p) for p in parts]


def parse_weights(text: str) -> list[float]:
    """``--weights 1,2,1``: one positive number per step (normalised to sum to 1)."""
    try:
        return [float(p) for p in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--weights {text!r}: give one positive number per step, e.g. --weights 1,1,2"
        ) from None
