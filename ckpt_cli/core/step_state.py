"""The verdict on a step: its items together are one training state (an nnx ``model`` beside
its ``optimizer``, a TrainState beside a data iterator's JSON item). ``core.state`` finds the parts
among one item's leaves; this module says which item holds each part of the step, and what a
resumed run loses where a part is missing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from ckpt_cli.core.state import LEAF_PARTS, LOSS_IF_MISSING, Part, PartJSON, StatePart

_DATA_WORDS = {"data", "dataset", "ds", "iter", "iterator", "loader", "dataloader", "pipeline"}
_DATA_WORDS |= {"sampler", "grain"}


def is_data_iterator(name: str, handler: str | None, parts: Sequence[StatePart]) -> bool:
    """Whether an item is the state of a data iterator: its name says so (``data_iter``) or its
    handler is grain's, and it holds no parameters or optimizer state."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    named = bool(words & _DATA_WORDS) or "grain" in (handler or "").lower()
    holds_model = any(p.present and p.part in ("params", "opt_state") for p in parts)
    return named and not holds_model


@dataclass(frozen=True)
class ItemParts:
    """What one item of a step holds of a training state: the parts among its leaves, or, for
    a data iterator's state, the data order (``data_note`` describes it)."""

    item: str
    parts: tuple[StatePart, ...]
    data_note: str | None = None
    #: A data iterator's item that saves nothing (Kauldron's ``ds_iter`` under its no-op
    #: handler): named where the data order is said to be missing.
    saves_nothing: bool = False


class TrainingStateJSON(TypedDict):
    #: schema 4: ``step`` (every item of the step) or ``item`` (a save outside a step)
    scope: Literal["step", "item"]
    items: list[str]  # schema 4: the items the verdict covers
    complete: bool  # every required part present (params, opt_state, step)
    missing: list[str]  # schema 4: required parts absent: why ``complete`` is false
    notes: list[str]  # schema 4: optional parts absent: what resuming loses, not a failure
    parts: list[PartJSON]


@dataclass(frozen=True)
class TrainingState:
    """The verdict on a step (or a lone save): which item holds which part, what is missing."""

    scope: Literal["step", "item"]
    items: tuple[str, ...]
    parts: tuple[StatePart, ...]

    @property
    def complete(self) -> bool:
        return bool(self.parts) and not self.missing

    @property
    def missing(self) -> list[Part]:
        return [p.part for p in self.parts if p.required and not p.present]

    @property
    def notes(self) -> list[Part]:
        return [p.part for p in self.parts if not p.required and not p.present]

    def to_json(self) -> TrainingStateJSON:
        return {
            "scope": self.scope,
            "items": list(self.items),
            "complete": self.complete,
            "missing": list(self.missing),
            "notes": list(self.notes),
            "parts": [p.to_json() for p in self.parts],
        }


def training_state(
    items: Sequence[ItemParts], dir_step: int | None, scope: Literal["step", "item"] = "step"
) -> TrainingState:
    """The training state the ``items`` of one step hold together. A step counter may come from
    the directory name (``dir_step``: what ``CheckpointManager.latest_step()`` returns); a data
    iterator's item is the data order and its leaves count for no other part."""
    if not any(it.parts or it.data_note for it in items):
        return TrainingState(scope, tuple(it.item for it in items), ())
    data = [it for it in items if it.data_note is not None]
    model = [it for it in items if it.data_note is None]
    data_items = tuple(it.item for it in data)
    out = [_merged(part, model, dir_step, data_items) for part in LEAF_PARTS]
    if data:
        notes = "; ".join(f"{it.data_note}" for it in data)
        out.append(StatePart("data_order", True, (), (), notes, data_items, source="item"))
    else:
        empty = [it.item for it in items if it.saves_nothing]
        note = LOSS_IF_MISSING["data_order"]
        if empty:
            note = (
                f"{', '.join(empty)} saves nothing (a no-op handler): a resumed input pipeline "
                "starts over unless it derives its position from the step"
            )
        out.append(StatePart("data_order", False, (), (), note))
    return TrainingState(scope, tuple(it.item for it in items), tuple(out))


def _merged(
    part: Part, items: Sequence[ItemParts], dir_step: int | None, data: tuple[str, ...]
) -> StatePart:
    """One part across items: where it is found, or what its absence loses."""
    holders = [(it.item, p) for it in items for p in it.parts if p.part == part and p.present]
    if holders:
        names = tuple(name for name, _ in holders)
        subtrees = tuple(dict.fromkeys(s for _, p in holders for s in p.subtrees))
        leaves = tuple(f"{name}/{leaf}" for name, p in holders for leaf in p.leaves)
        if len(holders) == 1:
            note = holders[0][1].note
        else:
            note = "; ".join(f"{name}: {p.note}" for name, p in holders)
        return StatePart(part, True, subtrees, leaves, note, names, source="tree")
    if part == "step" and dir_step is not None:
        note = (
            f"{dir_step} (no step counter saved: resume the count from "
            "CheckpointManager.latest_step())"
        )
        return StatePart(part, True, (), (), note, source="directory")
    note = LOSS_IF_MISSING[part]
    if part == "rng" and data:
        note += f"; the data order is kept ({', '.join(data)})"
    return StatePart(part, False, (), (), note)
