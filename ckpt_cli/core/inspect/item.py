"""``inspect_item``: one item read without touching array data: leaves from ``_METADATA``,
dtype, shape and chunking from each array's zarr header (one batch of kvstore reads), sharding
from ``_sharding``, write shapes and typed-key markers from ``array_metadatas``, strings from
``_strings.json``; a JSON item's values flattened into leaves."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore
from ckpt_cli.core.format.discovery import ItemRef
from ckpt_cli.core.format.items import ItemKind, classify, step_handler
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
    compile_filter,
    json_item_files,
)
from ckpt_cli.core.format.sharding import (
    ShardingInfo,
    read_shardings,
)
from ckpt_cli.core.inspect import ItemReport, Leaf, SubtreeTotal
from ckpt_cli.core.regex import Regex
from ckpt_cli.core.state import StatePart, analyse_state
from ckpt_cli.errors import (
    NotACheckpointError,
    NotFoundError,
)


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
