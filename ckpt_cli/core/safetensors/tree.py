"""The containers of an exported tree: recorded by ``export`` (``ckpt.tree``), rebuilt by
``import``, or taken from the ``--target`` abstract state.

A safetensors file holds flat tensors; Orbax restores a tree. ``StandardRestore(abstract)``
compares the abstract state's structure with the item's ``_METADATA``, where each key of a
leaf's path records the kind of its container (1: a sequence, a tuple or list; 2: a mapping,
a dict, NamedTuple or dataclass field) and every empty node (``None``, ``optax.EmptyState()``,
``{}``, ``()``) has an entry of its own (``value_type`` ``None``/``Dict``/``List``/``Tuple``,
no data). Without them optax's state tuples come back as dicts and the restore fails.

``ckpt.tree`` (``__metadata__`` of every exported file) is ``{"version": 1, "tree": NODE}``:

* a JSON object: a mapping, one member per key;
* a JSON array: a sequence, one element per index (``0`` where an index was not exported);
* ``1``: a tensor Orbax saved as a ``jax.Array``, named by its path joined with ``.``;
* ``"scalar"``, ``"np.ndarray"``: a tensor saved from a Python number or a numpy array;
* ``"None"``, ``"Dict"``, ``"List"``, ``"Tuple"``, ``"NamedTuple"``: an empty node (no tensor).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_cli.errors import RefusedError, require_orbax_extra

TREE_KEY = "ckpt.tree"
#: The ``__metadata__`` key naming the item ``ckpt export`` read: ``ckpt import`` writes under it.
ITEM_KEY = "ckpt.item"
#: The exported step's directory name: an import into a new root names its step the same way.
STEP_NAME_KEY = "ckpt.step_name"
#: The exported step's number: ``ckpt import`` writes that step unless ``--step`` says otherwise.
STEP_KEY = "ckpt.step"
TREE_VERSION = 1
ARRAY = "jax.Array"
#: Orbax's value types of empty nodes (``empty_values.RESTORE_TYPE_*``).
EMPTY_TYPES = frozenset({"None", "Dict", "List", "Tuple", "NamedTuple"})
SEQUENCE, MAPPING = 1, 2


@dataclass(frozen=True)
class Node:
    """A leaf of the tree: a tensor or an empty node, with its container kinds."""

    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str

    @property
    def name(self) -> str:
        return ".".join(self.keypath)

    @property
    def empty(self) -> bool:
        return self.value_type in EMPTY_TYPES


@dataclass(frozen=True)
class Containers:
    """The leaves and empty nodes of a tree, and where they were learnt (``ckpt.tree`` or
    ``target``)."""

    nodes: tuple[Node, ...]
    origin: str

    @property
    def tensors(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes if not n.empty}

    @property
    def empties(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.empty)


def encode_tree(nodes: Iterable[Node]) -> str:
    """The ``ckpt.tree`` value of these leaves and empty nodes (compact JSON)."""
    nodes = list(nodes)
    kinds: dict[tuple[str, ...], int] = {}
    children: dict[tuple[str, ...], dict[str, Any]] = {}
    for n in nodes:
        for i, t in enumerate(n.key_types):
            kinds.setdefault(n.keypath[:i], t)
            children.setdefault(n.keypath[:i], {}).setdefault(n.keypath[i], None)
    codes = {n.keypath: 1 if n.value_type == ARRAY else n.value_type for n in nodes}

    def build(prefix: tuple[str, ...]) -> Any:
        if prefix in codes:
            return codes[prefix]
        keys = children.get(prefix, {})
        if kinds.get(prefix) != SEQUENCE:
            return {k: build((*prefix, k)) for k in keys}
        at = {int(k): build((*prefix, k)) for k in keys}
        return [at.get(i, 0) for i in range(max(at, default=-1) + 1)]

    tree = build(()) if nodes else {}
    return json.dumps({"version": TREE_VERSION, "tree": tree}, separators=(",", ":"))


def parse_tree(text: str) -> Containers:
    """The leaves and empty nodes a ``ckpt.tree`` value records; refused when damaged or of a
    newer version."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or "tree" not in doc:
        raise _damaged("it is not a JSON object with a tree")
    if doc.get("version") != TREE_VERSION:
        raise RefusedError(
            f"the files' {TREE_KEY} metadata has version {doc.get('version')!r}; this ckpt "
            f"reads version {TREE_VERSION}; nothing written",
            hint="import with a newer ckpt, or give the tree with --target MODULE:FUNCTION",
        )
    nodes: list[Node] = []
    try:
        _walk(doc["tree"], (), (), nodes)
    except RecursionError:
        raise _damaged("it is nested deeper than Python can follow") from None
    return Containers(tuple(nodes), TREE_KEY)


def _walk(obj: Any, keypath: tuple[str, ...], types: tuple[int, ...], out: list[Node]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, (*keypath, k), (*types, MAPPING), out)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            if not (type(v) is int and v == 0):
                _walk(v, (*keypath, str(i)), (*types, SEQUENCE), out)
    elif type(obj) is int and obj == 1:
        out.append(Node(keypath, types, ARRAY))
    elif isinstance(obj, str) and obj:
        out.append(Node(keypath, types, obj))
    else:
        raise _damaged(f"{'.'.join(keypath) or 'its root'} is {json.dumps(obj)}")


def _damaged(why: str) -> RefusedError:
    return RefusedError(
        f"the files' {TREE_KEY} metadata is damaged ({why}); nothing written",
        hint="give the tree with --target MODULE:FUNCTION, or remove the key from the files",
    )


def target_containers(tree: Any) -> Containers:
    """The leaves and empty nodes of an abstract state as Orbax's StandardSave records them
    (imports jax): a node without children is a leaf (``tree_utils.is_empty_or_leaf``)."""
    require_orbax_extra("--target")
    import jax

    from ckpt_cli.core.spec.target import key_name

    def childless(x: Any) -> bool:
        kids = jax.tree_util.tree_flatten(x, is_leaf=lambda y: y is not x)[0]
        return not kids

    nodes = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=childless)[0]:
        keypath = tuple(key_name(k) for k in path)
        types = tuple(
            SEQUENCE
            if isinstance(k, (jax.tree_util.SequenceKey, jax.tree_util.FlattenedIndexKey))
            else MAPPING
            for k in path
        )
        nodes.append(Node(keypath, types, _value_type(leaf)))
    return Containers(tuple(nodes), "target")


def _value_type(leaf: Any) -> str:
    """Orbax's value type of a target leaf (``type_handler_registry.get_param_typestr`` without
    rich types: an empty NamedTuple, as any empty object it has no handler for, is ``None``)."""
    import numpy as np

    if leaf is None:
        return "None"
    if isinstance(leaf, np.ndarray):
        return "np.ndarray"
    if isinstance(leaf, (int, float)):
        return "scalar"
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return ARRAY
    if isinstance(leaf, str):
        return "string"
    if isinstance(leaf, list):
        return "List"
    if isinstance(leaf, tuple):
        return "None" if hasattr(leaf, "_fields") else "Tuple"
    if isinstance(leaf, Mapping):
        return "Dict"
    return "None"
