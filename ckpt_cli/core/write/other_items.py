"""The items of a step that a rewrite does not rewrite leaf by leaf, copied as they are (never
a symlink, nor what one points to); an ArraySave item of Orbax 0.4 in OCDBT, which Orbax 0.12
cannot restore, rewritten the way 0.12 writes one."""

from __future__ import annotations

from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.format.discovery import ItemRef, step_items
from ckpt_cli.core.format.items import is_noop_handler, step_handler
from ckpt_cli.core.format.metadata import (
    ARRAY_ITEM_LEAF,
    KEY_TYPE_DICT,
    legacy_array_tree,
)
from ckpt_cli.core.format.names import (
    TREE_METADATA,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.item import (
    ARRAY_HANDLER,
    JSON_HANDLER,
    STANDARD_HANDLER,
    ItemWriter,
)
from ckpt_cli.core.write.step import StepWriter
from ckpt_cli.core.write.types import ArrayOut, LeafOut
from ckpt_cli.errors import (
    NotFoundError,
    RefusedError,
)


def copy_other_items(
    src: ItemRef,
    writer: StepWriter,
    handlers: dict[str, str] | str | None,
    memory_limit: int,
    skip: set[str],
) -> None:
    assert src.step_location is not None
    children = src.step_location.list()
    linked = [e.name for e in children if e.is_symlink]
    if linked:
        raise RefusedError(
            f"the source step {src.step_location} has a symlink for item {linked[0]!r}: ckpt "
            "never copies a link or what it points to, nothing written",
            hint=f"run `ckpt verify {src.step_location}`; replace the link by the directory",
        )
    for name in step_items(src.step_location, children, handlers):
        if name in skip:
            continue
        loc = src.step_location.child(name)
        try:
            walked = list(loc.walk())
        except NotFoundError:
            if not is_noop_handler(step_handler(handlers, name)):
                raise
            walked = []  # a no-op handler's item on an object store: no object at all
        if not walked:
            writer.empty_items.add(name)  # a no-op handler's item: an empty directory
        inside = [rel for rel, entry in walked if entry.is_symlink]
        if inside:
            raise RefusedError(
                f"the source item {loc} holds a symlink ({inside[0]}): ckpt never copies a "
                "link or what it points to, nothing written",
                hint=f"run `ckpt verify {src.step_location}`; replace the link by the file",
            )
        known = handlers.get(name) if isinstance(handlers, dict) else None
        if not walked:
            writer.item(name, known or STANDARD_HANDLER)
            continue
        legacy = legacy_array_tree(loc)
        if legacy is not None and legacy.use_ocdbt:
            _rewrite_ocdbt_array_item(loc, writer.item(name, ARRAY_HANDLER), memory_limit)
        else:
            loc.copy_tree(writer.item(name, known or _handler_of(loc)))


def _rewrite_ocdbt_array_item(item: Location, dest: Location, memory_limit: int) -> None:
    """An ArraySave item of Orbax 0.4 (one array in an OCDBT database, no _METADATA), which
    Orbax 0.12 cannot restore ("Resource not defined: cache_pool#ocdbt"), written the way 0.12
    writes one: _METADATA naming `checkpoint`, plain zarr2. The values are the same."""
    store = ItemStore(item, use_zarr3=False)
    info, label = store.read_headers([ARRAY_ITEM_LEAF])[ARRAY_ITEM_LEAF]
    chunks = tuple(max(1, c) for c in info.chunk_shape)
    leaf = LeafOut(
        keypath=(ARRAY_ITEM_LEAF,),
        key_types=(KEY_TYPE_DICT,),
        value_type="np.ndarray",  # restores without a mesh, as 0.12 restores the 0.5 layout
        array=ArrayOut(info.dtype, info.shape, chunks, zarr3=False),
        source=store.reader(ARRAY_ITEM_LEAF, info, label).read,
        source_chunks=info.chunk_shape,
    )
    out = ItemWriter(dest, use_ocdbt=False, use_zarr3=False, memory_limit=memory_limit)
    out.write_arrays([leaf])
    out.write_metadata([leaf])


def _handler_of(item: Location) -> str:
    """The handler of an item whose step recorded none (Orbax before 0.11), from its files."""
    names = frozenset(e.name for e in item.list())
    if legacy_array_tree(item, names) is not None:
        return ARRAY_HANDLER
    return STANDARD_HANDLER if TREE_METADATA in names else JSON_HANDLER
