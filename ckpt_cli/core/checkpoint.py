"""A checkpoint opened for reading from Python: its steps, one item, the values of its leaves.

``Checkpoint`` is a root, a step or an item directory wherever it lives; ``Item`` reads leaves
straight from TensorStore (numpy arrays, ``ml_dtypes`` for bfloat16 and friends), a region at a
time when asked, without JAX and without the topology the checkpoint was saved on.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ckpt_cli.core.format.arrays import ItemStore, cached_context
from ckpt_cli.core.format.discovery import ItemRef, detect
from ckpt_cli.core.format.metadata import KEY_TYPE_SEQUENCE
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.format.scan import OPEN_CACHE_BYTES, read_block
from ckpt_cli.core.inspect import ItemReport, Leaf
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.inspect.step import with_training_state
from ckpt_cli.core.listing import StepInfo, list_root
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.base import loads_json
from ckpt_cli.errors import NotFoundError, StorageError, UsageError, first_line

#: What an empty container leaf reads as (Orbax stores no data for them).
_EMPTY: dict[str, Any] = {"None": None, "Dict": {}, "List": [], "Tuple": (), "NamedTuple": {}}


class Checkpoint:
    """A root of steps, one step or one item, ready to list and read (``ckpt_cli.open``)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        #: ``root``, ``step``, ``item`` or ``legacy`` (a Flax msgpack file, not readable here).
        self.kind = detect(location).kind

    def steps(self) -> list[StepInfo]:
        """Every step of a root (a step lists itself), committed or not, oldest first; the
        same as ``ckpt ls --json``."""
        return list(list_root(self.location).steps)

    def item(self, step: int | None = None, item: str | None = None) -> Item:
        """One item: of ``step`` (default: the latest committed step), named ``item`` (default:
        the only one besides ``metrics``)."""
        return Item(resolve_item(self.location, step, item))

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.location)!r}, kind={self.kind!r})"


class Item:
    """One item of a step: its leaves (metadata only) and their values on request."""

    def __init__(self, ref: ItemRef) -> None:
        self.ref = ref

    @property
    def path(self) -> str:
        return str(self.ref.location)

    @property
    def step(self) -> int | None:
        return self.ref.step

    @property
    def name(self) -> str:
        return self.ref.name

    @functools.cached_property
    def report(self) -> ItemReport:
        """Everything ``ckpt inspect`` knows about the item (read once, on first use), with the
        training state of its step, across its items."""
        return with_training_state(self._report)

    @functools.cached_property
    def _report(self) -> ItemReport:
        # The item alone: its leaves and values need no sibling read.
        return inspect_item(self.ref)

    @property
    def leaves(self) -> list[Leaf]:
        """Every leaf: name, keypath, dtype, shape, chunking, sharding, value type."""
        return list(self._report.leaves)

    def leaf(self, name: str) -> Leaf:
        found = self._by_name.get(name)
        if found is None:
            raise NotFoundError(
                f"no leaf named {name!r} in {self.path}",
                hint="item.leaves lists them (or run `ckpt inspect --flat`)",
            )
        return found

    def read(self, name: str, index: Any = None) -> Any:
        """The value of one leaf: a numpy array for arrays (``index``, e.g. ``np.s_[0:16, :]``,
        reads only that region), the string of a string leaf, the JSON value of a JSON item's
        leaf, None or an empty container for Orbax's empty markers."""
        leaf = self.leaf(name)
        if leaf.value_type == "string":
            return leaf.value
        if leaf.value_type == "json":
            return loads_json(leaf.value or "null", f"leaf {name!r}")
        if leaf.array is None:
            if leaf.value_type in _EMPTY:
                return _copy(_EMPTY[leaf.value_type])
            raise StorageError(f"leaf {name!r} of {self.path} has no readable data: {leaf.problem}")
        box, local = _region(index, leaf.array.shape)
        reader = self._store.reader(leaf.name, leaf.array, leaf.database)
        try:
            import numpy as np

            values = np.asarray(read_block(reader, box).result())
        except Exception as e:
            raise StorageError(
                f"cannot read leaf {name!r} of {self.path}: {first_line(e)}",
                hint="run `ckpt verify` on it",
            ) from None
        return values[local] if local else values

    def read_tree(self) -> Any:
        """Every leaf's value in its tree: nested dicts, lists where Orbax saved sequences.
        Reads everything into memory: meant for small checkpoints."""
        root: dict[str, Any] = {}
        sequences: set[int] = set()
        for leaf in self.leaves:
            node = root
            for depth, key in enumerate(leaf.keypath[:-1]):
                child = node.setdefault(key, {})
                if leaf.key_types[depth + 1 : depth + 2] == (KEY_TYPE_SEQUENCE,):
                    sequences.add(id(child))
                node = child
            if leaf.keypath:
                node[leaf.keypath[-1]] = self.read(leaf.name)
        if self.leaves and self.leaves[0].key_types[:1] == (KEY_TYPE_SEQUENCE,):
            sequences.add(id(root))
        return _as_lists(root, sequences)

    @functools.cached_property
    def _by_name(self) -> dict[str, Leaf]:
        return {leaf.name: leaf for leaf in self._report.leaves}

    @functools.cached_property
    def _store(self) -> ItemStore:
        # One TensorStore context for the item: reads of many leaves share its cache of the
        # OCDBT manifest and tree nodes instead of reading them again per leaf.
        return ItemStore(
            self.ref.location, self._report.zarr_format == 3, cached_context(OPEN_CACHE_BYTES)
        )

    def __repr__(self) -> str:
        return f"Item({self.path!r}, step={self.step}, name={self.name!r})"


def _region(index: Any, shape: tuple[int, ...]) -> tuple[tuple[slice, ...], tuple[Any, ...]]:
    """A numpy-style index as (the box to read, the indexing left to apply to that box)."""
    if index is None:
        return tuple(slice(0, n) for n in shape), ()
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise UsageError("an index may hold one ... at most")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    if len(items) > len(shape):
        raise UsageError(f"index {index!r} has {len(items)} entries for a rank-{len(shape)} leaf")
    items += [slice(None)] * (len(shape) - len(items))
    box: list[slice] = []
    local: list[slice | int] = []
    for i, n in zip(items, shape, strict=True):
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step < 0:
                raise UsageError("negative slice steps are not supported; read, then reverse")
            stop = max(start, stop)
            box.append(slice(start, stop))
            local.append(slice(0, stop - start, step))
        elif isinstance(i, int) or type(i).__name__.startswith("int"):
            k = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= k < n:
                raise UsageError(f"index {int(i)} is out of bounds for a dimension of {n}")
            box.append(slice(k, k + 1))
            local.append(0)
        else:
            raise UsageError(f"unsupported index {i!r}: use ints, slices and ...")
    whole = all(
        b == slice(0, n) and loc == slice(0, n, 1)
        for b, loc, n in zip(box, local, shape, strict=True)
    )
    return tuple(box), () if whole or not math.prod(shape) else tuple(local)


def _copy(value: Any) -> Any:
    return type(value)() if isinstance(value, (dict, list)) else value


def _as_lists(node: Any, sequences: set[int]) -> Any:
    if not isinstance(node, dict):
        return node
    converted = {k: _as_lists(v, sequences) for k, v in node.items()}
    keys = list(converted)
    if id(node) in sequences and sorted(keys) == sorted(str(i) for i in range(len(keys))) and keys:
        return [converted[str(i)] for i in range(len(keys))]
    return converted
