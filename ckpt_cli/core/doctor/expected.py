"""What the checkpoint is to be restored into, as leaves (dotted name -> shape, dtype): an
abstract state returned by the user's function (``--target``, imports jax), another Orbax
checkpoint (``--like CKPT``), or safetensors files (``--like DIR``: tensor names as ckpt's
``export`` writes them, the leaves' dotted names)."""

from __future__ import annotations

import os
from typing import NamedTuple

from ckpt_cli.core.doctor.types import Leaves
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.safetensors.tree import EMPTY_TYPES
from ckpt_cli.core.storage import Location, StorageOptions, open_location
from ckpt_cli.errors import RefusedError, require_orbax_extra


class Tree(NamedTuple):
    """The leaves, and the empty nodes (``None``, optax's ``EmptyState``, ``()``), which hold no
    value but which Orbax's restore wants in the same places; None where the source does not
    say (safetensors)."""

    leaves: Leaves
    empty: frozenset[str] | None
    sharded: bool = False  # the target names its shardings (Orbax then ignores the recorded ones)
    devices: int | None = None  # the devices of this process (--target: jax is loaded)


def stored_tree(report: ItemReport) -> Tree:
    """An item's leaves as a restore returns them: a typed key as ``key<fry>`` of its shape."""
    out: Leaves = {}
    empty = set()
    for leaf in report.leaves:
        if leaf.value_type in EMPTY_TYPES:
            empty.add(leaf.name)
        elif leaf.value_type in ("string", "json") or leaf.dtype is None:
            out[leaf.name] = (None, "string")
        elif leaf.key_dtype is not None:
            out[leaf.name] = (leaf.key_shape, leaf.key_dtype)
        else:
            out[leaf.name] = (leaf.shape, leaf.dtype)
    return Tree(out, frozenset(empty))


def target_tree(ref: str) -> Tree:
    """``--target MODULE:FN``: the function's abstract state, named as Orbax names it."""
    require_orbax_extra("--target")
    import jax

    from ckpt_cli.core.spec.target import call_target, flatten_abstract

    tree = call_target(ref)
    empty: set[str] = set()
    out = flatten_abstract(tree, typed_keys=True, empty=empty)
    if not out:
        raise RefusedError(f"--target {ref} returned no arrays: expected the abstract state")
    sharded = any(getattr(leaf, "sharding", None) is not None for leaf in jax.tree.leaves(tree))
    return Tree(out, frozenset(empty), sharded, jax.device_count())


def like_tree(path: str, item: str | None, storage: StorageOptions | None) -> Tree:
    """``--like``: another checkpoint's item (named ``item``, when it has one of that name), or a
    safetensors file or directory."""
    if _is_safetensors(path):
        return _safetensors_tree(path)
    from ckpt_cli.core.format.resolve import resolve_item

    location: Location = open_location(path, storage)
    return stored_tree(inspect_item(resolve_item(location, None, item)))


def _is_safetensors(path: str) -> bool:
    """A safetensors file, index or folder (not an Orbax checkpoint that also holds one); a
    bucket path named like safetensors is refused (local files only)."""
    from ckpt_cli.core.safetensors.source import is_safetensors_source

    return is_safetensors_source(path)


def _safetensors_tree(path: str) -> Tree:
    """The files' tensors; their empty nodes from the ``ckpt.tree`` metadata ``ckpt export``
    writes (None, not compared, for files of other tools)."""
    from ckpt_cli.core.safetensors.dtypes import numpy_dtype_name
    from ckpt_cli.core.safetensors.reader import SafetensorsReader, find_files
    from ckpt_cli.core.safetensors.tree import TREE_KEY, parse_tree

    files = find_files(path)
    out: Leaves = {}
    recorded: str | None = None
    for name in files.files:
        with SafetensorsReader.open(os.path.join(files.directory, name)) as reader:
            recorded = (reader.header.metadata or {}).get(TREE_KEY, recorded)
            for t in reader.header.tensors:
                out[t.name] = (t.shape, numpy_dtype_name(t.dtype, f"{name}: tensor {t.name}"))
    if recorded is None:
        return Tree(out, None)
    return Tree(out, frozenset(n.name for n in parse_tree(recorded).empties))
