"""What the checkpoint is to be restored into, as leaves (dotted name -> shape, dtype): an
abstract state returned by the user's function (``--target``, imports jax), another Orbax
checkpoint (``--like CKPT``), or safetensors files (``--like DIR``: tensor names as ckpt's
``export`` writes them, the leaves' dotted names)."""

from __future__ import annotations

import os

from ckpt_cli.core.doctor.types import Leaves
from ckpt_cli.core.inspect import ItemReport, inspect_item
from ckpt_cli.core.storage import Location, StorageOptions, open_location


def stored_leaves(report: ItemReport) -> Leaves:
    """An item's leaves as a restore sees them (typed keys as their stored key data)."""
    out: Leaves = {}
    for leaf in report.leaves:
        if leaf.value_type == "None":  # an empty node (optax's EmptyState): no leaf to restore
            continue
        if leaf.value_type in ("string", "json") or leaf.dtype is None:
            out[leaf.name] = (None, "string")
        else:
            out[leaf.name] = (leaf.shape, leaf.dtype)
    return out


def target_leaves(ref: str) -> Leaves:
    """``--target MODULE:FN``: the function's abstract state, named as Orbax names it."""
    from ckpt_cli.core.migrate.target import abstract_state

    return dict(abstract_state(ref))


def like_leaves(
    path: str, step: int | None, item: str | None, storage: StorageOptions | None
) -> Leaves:
    """``--like``: another checkpoint's item, or a safetensors file or directory."""
    if _is_safetensors(path):
        return _safetensors_leaves(path)
    from ckpt_cli.core.format.resolve import resolve_item

    location: Location = open_location(path, storage)
    return stored_leaves(inspect_item(resolve_item(location, step, item)))


def _is_safetensors(path: str) -> bool:
    if path.endswith((".safetensors", ".safetensors.index.json")):
        return True
    return os.path.isdir(path) and any(n.endswith(".safetensors") for n in os.listdir(path))


def _safetensors_leaves(path: str) -> Leaves:
    from ckpt_cli.core.safetensors.dtypes import numpy_dtype_name
    from ckpt_cli.core.safetensors.reader import SafetensorsReader, find_files

    files = find_files(path)
    out: Leaves = {}
    for name in files.files:
        with SafetensorsReader.open(os.path.join(files.directory, name)) as reader:
            for t in reader.header.tensors:
                out[t.name] = (t.shape, numpy_dtype_name(t.dtype, f"{name}: tensor {t.name}"))
    return out
