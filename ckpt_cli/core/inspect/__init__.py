"""What ``ckpt inspect`` shows for a path: one item, and what else its step holds; read without
touching array data (unless ``--stats`` asks for it).

Leaves come from ``_METADATA``; dtype, shape and chunking from each array's zarr header (one batch
of kvstore reads); sharding from ``_sharding``; write shapes and typed-key markers from
``array_metadatas``; strings from ``_strings.json``.

A path resolves to the item asked for (``--item``), else to its step's one state item (the only
one besides ``metrics``, or the only PyTree among JSON and ArraySave items); the other items of
that step are listed with it. When no item is the obvious one (two PyTree items), every item of
the step is shown (``inspect_path``). The training state is judged across every item of the
step, even when one item is asked for (``step_state.training_state``): the step is its unit.

This module holds what inspect reports (``ItemReport``, ``Leaf``, ``InspectResult``,
``StepInspection`` and their JSON documents); ``item.py`` reads one item (``inspect_item``),
``step.py`` resolves a path and judges the step (``inspect_path``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import ItemKind, describe
from ckpt_cli.core.format.names import (
    GRAIN_STATE_RE,
)
from ckpt_cli.core.format.sharding import (
    LayoutJSON,
    Shape,
    ShardingInfo,
    ShardingJSON,
    ShardLayout,
)
from ckpt_cli.core.schema import JSONValue
from ckpt_cli.core.state import KEY_DTYPES, StatePart, classify_leaf
from ckpt_cli.core.stats import LeafStats, StatsJSON
from ckpt_cli.core.step_state import (
    ItemParts,
    TrainingState,
    TrainingStateJSON,
    is_data_iterator,
    training_state,
)


class KeyDataJSON(TypedDict):
    """What a typed PRNG key stores: its data (``uint32[..., 2]`` for threefry)."""

    dtype: str | None
    shape: Shape


class LeafJSON(TypedDict):
    name: str
    keypath: list[str]
    value_type: str
    dtype: str | None  # a typed key's own: key<fry> (schema 3)
    shape: Shape | None  # a typed key's own shape, its data's without the last dimension
    key_data: KeyDataJSON | None
    chunk_shape: Shape | None
    write_shape: Shape | None
    elements: int | None
    size_bytes: int
    sharding: ShardingJSON | None
    state_part: str | None
    value: JSONValue  # strings, and JSON-item values as JSON values (schema 2)
    problem: str | None
    stats: NotRequired[StatsJSON | None]


class SubtreeJSON(TypedDict):
    name: str
    leaves: int
    parameters: int
    size_bytes: int


class TotalsJSON(TypedDict):
    leaves: int
    arrays: int
    parameters: int
    size_bytes: int
    subtrees: list[SubtreeJSON]


class InspectJSON(TypedDict):
    """``ckpt inspect --json``: the tree of one item."""

    schema_version: int
    ok: bool
    path: str
    root: str | None
    step: int | None
    item: str
    kind: ItemKind
    #: The handler the step recorded for the item (schema 5), None when none was recorded.
    handler: str | None
    #: What ckpt does with an item it does not read (kind ``empty``/``unknown``), else None.
    note: str | None
    storage: str
    zarr_format: int
    totals: TotalsJSON
    training_state: TrainingStateJSON
    custom_metadata: JSONValue
    step_custom_metadata: JSONValue
    leaves: list[LeafJSON]
    layout: NotRequired[LayoutJSON]
    other_items: NotRequired[list[OtherItemJSON]]


class OtherItemJSON(TypedDict):
    """Another item of the inspected step, named beside the state item."""

    item: str
    kind: ItemKind
    handler: str | None
    path: str
    leaves: int
    size_bytes: int


@dataclass(frozen=True)
class Leaf:
    """One leaf of an item: tree position, storage facts and (for strings) its value."""

    name: str
    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    chunk_shape: tuple[int, ...] | None = None
    write_shape: tuple[int, ...] | None = None
    sharding: ShardingInfo | None = None
    size_bytes: int = 0
    array: ArrayInfo | None = None
    database: str = ""
    random_key_impl: str | None = None
    value: str | None = None
    problem: str | None = None

    @functools.cached_property
    def part(self) -> str | None:
        """Which of the four training-state parts this leaf belongs to, if any."""
        return classify_leaf(self)

    @property
    def key_dtype(self) -> str | None:
        """A typed PRNG key's dtype as JAX names it (``key<fry>``); its stored data is uint32."""
        if not self.random_key_impl:
            return None
        return f"key<{KEY_DTYPES.get(self.random_key_impl, self.random_key_impl)}>"

    @property
    def key_shape(self) -> tuple[int, ...] | None:
        """A typed key's shape: its data's without the last dimension (2 words for threefry)."""
        if not self.random_key_impl or not self.shape:
            return None
        return self.shape[:-1]

    @property
    def elements(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def is_array(self) -> bool:
        return self.array is not None

    def to_json(self) -> LeafJSON:
        key_shape = self.key_shape
        shape = key_shape if key_shape is not None else self.shape
        return {
            "name": self.name,
            "keypath": list(self.keypath),
            "value_type": self.value_type,
            # A typed key shows as Orbax restores it: key<fry> of the key shape.
            "dtype": self.key_dtype or self.dtype,
            "shape": None if shape is None else list(shape),
            "key_data": {"dtype": self.dtype, "shape": list(self.shape or ())}
            if key_shape is not None
            else None,
            "chunk_shape": None if self.chunk_shape is None else list(self.chunk_shape),
            "write_shape": None if self.write_shape is None else list(self.write_shape),
            "elements": self.elements if self.shape is not None else None,
            "size_bytes": self.size_bytes,
            "sharding": None if self.sharding is None else self.sharding.to_json(),
            "state_part": self.part,
            # JSON-item values as JSON values (schema 2), string leaves as strings.
            "value": json.loads(self.value)
            if self.value_type == "json" and self.value is not None
            else self.value,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class SubtreeTotal:
    name: str
    leaves: int
    elements: int
    size_bytes: int

    def to_json(self) -> SubtreeJSON:
        return {
            "name": self.name,
            "leaves": self.leaves,
            "parameters": self.elements,
            "size_bytes": self.size_bytes,
        }


@dataclass(frozen=True)
class ItemReport:
    """What ``inspect`` knows about one item."""

    #: 2: JSON-item values are JSON values (they were JSON text in 1). 3: ``kind``; a typed
    #: key's ``dtype``/``shape`` are the key's (``key<fry>``), ``key_data`` what is stored;
    #: ``other_items``; a step of several items shows them all (``items``). 4: the training
    #: state is the step's, across its items (``scope``, ``items``, ``missing``, ``notes``; per
    #: part ``required``, ``items``, ``source``), with the data order as an optional part.
    #: 5: kinds ``empty`` and ``unknown`` (an item ckpt carries without reading it), the
    #: item's ``handler`` and a ``note`` (documents and ``other_items``). 6: a third
    #: document, safetensors (``source: "safetensors"``: tensors, files, index, config).
    SCHEMA_VERSION: ClassVar[int] = 6

    ref: ItemRef
    storage: str  # ocdbt | ocdbt-unmerged | zarr | json | none (empty) | unknown
    zarr_format: int
    leaves: tuple[Leaf, ...]
    state: tuple[StatePart, ...]
    custom_metadata: Any = None
    step_custom_metadata: dict[str, Any] | None = None
    subtrees: tuple[SubtreeTotal, ...] = field(default_factory=tuple)
    #: pytree (StandardSave, PyTreeSave), array (ArraySave: the item is one array) or json.
    kind: ItemKind = "pytree"
    #: The handler the step recorded for the item (``_CHECKPOINT_METADATA``), if any.
    handler: str | None = None
    #: The verdict on the training state of the item's step (``with_training_state``); None
    #: until it is computed: the item's own then.
    training: TrainingState | None = None

    @property
    def item_parts(self) -> ItemParts:
        """What this item holds of a training state, or that it is a data iterator's state."""
        name = self.ref.name
        if self.kind == "empty":
            return ItemParts(name, (), saves_nothing=is_data_iterator(name, self.handler, ()))
        if not is_data_iterator(name, self.handler, self.state):
            return ItemParts(name, self.state)
        if self.kind == "json":
            return ItemParts(name, self.state, _json_item_note(self.leaves))
        return ItemParts(name, self.state, f"{self.kind} item, {len(self.leaves)} leaves")

    @property
    def training_state(self) -> TrainingState:
        if self.training is not None:
            return self.training
        return training_state([self.item_parts], None, scope="item")

    @property
    def note(self) -> str | None:
        """What ckpt does with an item it does not read (``empty``/``unknown``)."""
        return describe(self.kind, self.handler) if self.kind in ("empty", "unknown") else None

    @property
    def total_bytes(self) -> int:
        return sum(leaf.size_bytes for leaf in self.leaves)

    @property
    def total_elements(self) -> int:
        return sum(leaf.elements for leaf in self.leaves if leaf.is_array)

    @property
    def problems(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.problem]

    def to_json(self) -> InspectJSON:
        ref = self.ref
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "path": str(ref.location),
            "root": str(ref.root) if ref.root else None,
            "step": ref.step,
            "item": ref.name,
            "kind": self.kind,
            "handler": self.handler,
            "note": self.note,
            "storage": self.storage,
            "zarr_format": self.zarr_format,
            "totals": {
                "leaves": len(self.leaves),
                "arrays": sum(1 for leaf in self.leaves if leaf.is_array),
                "parameters": self.total_elements,
                "size_bytes": self.total_bytes,
                "subtrees": [t.to_json() for t in self.subtrees],
            },
            "training_state": self.training_state.to_json(),
            "custom_metadata": self.custom_metadata,
            "step_custom_metadata": self.step_custom_metadata,
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }


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
    training_state: TrainingStateJSON  # schema 4: the step's, as in each item's document


@dataclass(frozen=True)
class StepInspection:
    """Every item of a step none of which is the obvious one to show alone."""

    items: tuple[InspectResult, ...]

    @property
    def training_state(self) -> TrainingState:
        return self.items[0].report.training_state

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
            "training_state": self.training_state.to_json(),
        }


def summary(report: ItemReport) -> OtherItemJSON:
    """One line's worth of an item: what ``other_items`` lists."""
    return {
        "item": report.ref.name,
        "kind": report.kind,
        "handler": report.handler,
        "path": str(report.ref.location),
        "leaves": len(report.leaves),
        "size_bytes": report.total_bytes,
    }


def _json_item_note(leaves: Sequence[Leaf]) -> str:
    """What a data iterator's JSON item holds: its top keys, or for grain's per-process files
    how many processes saved a state and the keys of the first."""
    keys = list(dict.fromkeys(leaf.keypath[0] for leaf in leaves if leaf.keypath))
    processes = [k for k in keys if GRAIN_STATE_RE.match(k + ".json")]
    if not processes or len(processes) != len(keys):
        return "JSON item: " + ", ".join(keys[:6])
    first = [leaf.keypath[1] for leaf in leaves if leaf.keypath[0] == keys[0] and leaf.keypath[1:]]
    count = f"{len(processes)} process" + ("es" if len(processes) > 1 else "")
    return f"grain iterator state, {count}: " + ", ".join(list(dict.fromkeys(first))[:6])
