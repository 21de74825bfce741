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
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import ItemKind, classify, describe, step_handler
from ckpt_cli.core.format.metadata import (
    ARRAY_ITEM_LEAF,
    KEY_TYPE_SEQUENCE,
    ArrayMetadata,
    LeafMeta,
    is_array_handler,
    legacy_array_tree,
    read_array_metadatas,
    read_step_metadata,
    read_strings,
    read_tree_metadata,
)
from ckpt_cli.core.format.names import (
    GRAIN_STATE_RE,
    METRICS_ITEM,
    compile_filter,
    json_item_files,
    parse_step_name,
)
from ckpt_cli.core.format.resolve import resolve_item, resolve_items
from ckpt_cli.core.format.sharding import (
    LayoutJSON,
    Shape,
    ShardingInfo,
    ShardingJSON,
    ShardLayout,
    read_shardings,
    shard_layout,
)
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.regex import Regex
from ckpt_cli.core.schema import JSONValue
from ckpt_cli.core.state import KEY_DTYPES, StatePart, analyse_state, classify_leaf
from ckpt_cli.core.stats import LeafStats, StatsJSON, leaves_stats
from ckpt_cli.core.step_state import (
    ItemParts,
    TrainingState,
    TrainingStateJSON,
    is_data_iterator,
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
    #: item's ``handler`` and a ``note`` (documents and ``other_items``).
    SCHEMA_VERSION: ClassVar[int] = 5

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


def _matches(name: str, pattern: Regex | None) -> bool:
    return pattern is None or bool(pattern.search(name))


def inspect_item(ref: ItemRef, name_filter: str | None = None) -> ItemReport:
    item = ref.location
    step_meta = read_step_metadata(ref.step_location) if ref.step_location else None
    handlers = step_meta.item_handlers if step_meta else None
    handler = step_handler(handlers, ref.name) if isinstance(handlers, dict) else None
    tree = read_tree_metadata(item)
    kind: ItemKind = "pytree"
    if tree is None:
        try:
            names = [e.name for e in item.list()]
        except NotFoundError:
            names = []  # an empty item on an object store is no object at all
        found = classify(names, handler)
        if found in ("empty", "unknown"):
            return _unread_item(
                ref, found, handler, step_meta.custom_metadata if step_meta else None
            )
        tree = legacy_array_tree(item)
        kind = "array"
    elif is_array_handler(handler) and [m.keypath for m in tree.leaves] == [(ARRAY_ITEM_LEAF,)]:
        kind = "array"  # ArraySave of Orbax 0.12+: a tree of one leaf named `checkpoint`
    pattern = compile_filter(name_filter)
    if tree is None:
        return replace(_inspect_json_item(ref, pattern), handler=handler)
    metas = list(tree.leaves)
    store = ItemStore(item, tree.use_zarr3)
    headers = store.read_headers([m.name for m in metas if m.has_array])
    shardings = read_shardings(item)
    array_metas = read_array_metadatas(item)
    strings = read_strings(item) if any(m.value_type == "string" for m in metas) else {}
    all_leaves = [_leaf(m, headers, shardings, array_metas, strings) for m in metas]
    if kind == "array":
        # The item is the array itself, as ArrayCheckpointHandler restores it: no keypath.
        # The leaf keeps its storage name (`checkpoint`) to be read and written by.
        all_leaves = [replace(leaf, keypath=(), key_types=()) for leaf in all_leaves]
    # The four-part analysis always sees the whole tree; the filter only narrows what is shown.
    leaves = [leaf for leaf in all_leaves if _matches(leaf.name, pattern)]
    return ItemReport(
        ref=ref,
        storage=store.layout,
        kind=kind,
        zarr_format=3 if tree.use_zarr3 else 2,
        leaves=tuple(leaves),
        state=_with_step_value(analyse_state(all_leaves), all_leaves, store, ref.step),
        custom_metadata=tree.custom_metadata,
        step_custom_metadata=step_meta.custom_metadata if step_meta else None,
        subtrees=_subtree_totals(leaves),
        handler=handler,
    )


def _unread_item(
    ref: ItemRef, kind: ItemKind, handler: str | None, step_custom: dict[str, Any] | None
) -> ItemReport:
    """An item ckpt carries without reading it: an empty one (a no-op handler's, such as
    Kauldron's ``ds_iter``) or one of a handler it does not know. No leaves; the handler and
    what ckpt does with it (``note``) say the rest."""
    return ItemReport(
        ref=ref,
        storage="none" if kind == "empty" else "unknown",
        kind=kind,
        zarr_format=0,
        leaves=(),
        state=(),
        step_custom_metadata=step_custom,
        handler=handler,
    )


def _inspect_json_item(ref: ItemRef, pattern: Regex | None) -> ItemReport:
    """A JsonSave item (``metadata`` file), the ``metrics`` item, or a grain iterator's state
    (``process_<i>-of-<n>.json``, its leaves under the file's name): JSON values as leaves."""
    item = ref.location
    files = json_item_files([e.name for e in item.list() if not e.is_dir])
    if not files:
        raise NotACheckpointError(
            f"{item} has neither _METADATA (a PyTree item) nor a JSON item file",
            hint="the item is damaged or of an unknown kind; run `ckpt verify` on it",
        )
    grain = [f for f in files if GRAIN_STATE_RE.match(f)]
    if grain:
        doc = {f.removesuffix(".json"): item.child(f).read_json() for f in grain}
    else:
        doc = item.child(files[0]).read_json()
    leaves = [
        Leaf(
            name=".".join(kp),
            keypath=kp,
            key_types=kt,
            value_type="json",
            value=json.dumps(v, ensure_ascii=False),
            size_bytes=len(json.dumps(v)),
        )
        for kp, kt, v in _flatten_json(doc, (), ())
    ]
    leaves = [leaf for leaf in leaves if _matches(leaf.name, pattern)]
    return ItemReport(
        ref=ref,
        storage="json",
        kind="json",
        zarr_format=0,
        leaves=tuple(leaves),
        state=(),
        subtrees=_subtree_totals(leaves),
    )


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


def _flatten_json(
    doc: Any, path: tuple[str, ...], types: tuple[int, ...]
) -> list[tuple[tuple[str, ...], tuple[int, ...], Any]]:
    if isinstance(doc, dict) and doc:
        return [x for k, v in doc.items() for x in _flatten_json(v, (*path, str(k)), (*types, 2))]
    if isinstance(doc, list) and doc:
        return [
            x for i, v in enumerate(doc) for x in _flatten_json(v, (*path, str(i)), (*types, 1))
        ]
    return [(path or ("value",), types or (2,), doc)]


def _leaf(
    meta: LeafMeta,
    headers: dict[str, tuple[ArrayInfo, str]],
    shardings: dict[str, ShardingInfo],
    array_metas: dict[str, ArrayMetadata],
    strings: dict[str, str],
) -> Leaf:
    am = array_metas.get(meta.name)
    base: dict[str, Any] = {
        "name": meta.name,
        "keypath": meta.keypath,
        "key_types": meta.key_types,
        "value_type": meta.value_type,
        "sharding": shardings.get(meta.name),
        "write_shape": meta.write_shape or (am.write_shape if am else None),
        "random_key_impl": (am.ext_metadata or {}).get("random_key_impl") if am else None,
    }
    if meta.value_type == "string":
        value = strings.get(meta.name)
        problem = None if value is not None else "string value missing from _strings.json"
        return Leaf(**base, value=value, problem=problem, size_bytes=len((value or "").encode()))
    if not meta.has_array:
        return Leaf(**base)
    found = headers.get(meta.name)
    if found is None:
        return Leaf(**base, problem="no array data found for this leaf")
    info, label = found
    return Leaf(
        **base,
        dtype=info.dtype,
        shape=info.shape,
        chunk_shape=info.chunk_shape,
        size_bytes=info.nbytes,
        array=info,
        database=label,
    )


def _with_step_value(
    parts: tuple[StatePart, ...], leaves: list[Leaf], store: ItemStore, dir_step: int | None
) -> tuple[StatePart, ...]:
    """Read the saved step counter (one scalar) and compare it with the directory's step."""

    out = []
    for part in parts:
        leaf = next((lf for lf in leaves if part.part == "step" and lf.name in part.leaves), None)
        if leaf is not None and leaf.array is not None and leaf.array.size == 1:
            try:
                value = int(store.read_scalar(leaf.name, leaf.array, leaf.database))
            except Exception:  # unreadable data is verify's business; inspect shows metadata
                value = None
            if value is not None:
                note = f"{leaf.name} = {value}"
                if dir_step is not None and value != dir_step:
                    note += f" (the directory says step {dir_step})"
                part = replace(part, note=note)
        out.append(part)
    return tuple(out)


def _subtree_totals(leaves: list[Leaf]) -> tuple[SubtreeTotal, ...]:
    totals: dict[str, list[int]] = {}
    for leaf in leaves:
        top = leaf.keypath[0] if leaf.keypath else ""
        if leaf.key_types and leaf.key_types[0] == KEY_TYPE_SEQUENCE:
            top = f"[{top}]"
        t = totals.setdefault(top, [0, 0, 0])
        t[0] += 1
        t[1] += leaf.elements if leaf.is_array else 0
        t[2] += leaf.size_bytes
    return tuple(SubtreeTotal(k, *v) for k, v in totals.items())


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
