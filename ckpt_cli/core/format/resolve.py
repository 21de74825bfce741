"""Resolve a user's path (+ ``--step``/``--item``) to exactly one item, or say why it cannot."""

from __future__ import annotations

from ckpt_cli.core.format.discovery import (
    ItemRef,
    StepRef,
    choose_item,
    detect,
    item_location,
    latest_committed,
    legacy_msgpack_error,
    step_items,
    step_ref,
)
from ckpt_cli.core.format.items import item_kind
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.names import DELETION_RECORD, parse_step_name
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import NotACheckpointError, NotFoundError, SeveralItemsError, UsageError


def find_step(root: Location, steps: list[StepRef], step: int | None) -> StepRef:
    """The requested step of a root, or its latest committed one."""
    if step is None:
        latest = latest_committed(steps)
        if latest is None:
            unfinished = sum(1 for s in steps if not s.committed)
            raise NotACheckpointError(
                f"{root} has no committed step"
                + (f" ({unfinished} unfinished or uncommitted)" if unfinished else ""),
                hint="run `ckpt ls` on it to see what is there",
            )
        return latest
    matches = [s for s in steps if s.step == step]
    committed = [s for s in matches if s.committed]
    if committed:
        return committed[0]
    if matches:
        why = f": {matches[0].reason}" if matches[0].reason else ""
        raise NotACheckpointError(
            f"step {step} of {root} is {matches[0].status} ({matches[0].name}){why}",
            hint=f"pass the directory {matches[0].location} itself to look inside anyway",
        )
    have = ", ".join(str(s.step) for s in steps if s.committed) or "none"
    raise NotFoundError(f"step {step} not found in {root}", hint=f"committed steps: {have}")


#: ``_resolve``'s item argument for "every item of the step".
ALL_ITEMS = "\0all"


def resolve_item(location: Location, step: int | None = None, item: str | None = None) -> ItemRef:
    """Resolve a root, step or item directory to one item: ``item``, else the step's one
    state item (``choose_item``)."""
    found = _resolve(location, step, item)
    assert not isinstance(found, list)
    return found


def _resolve(location: Location, step: int | None, item: str | None) -> ItemRef | list[ItemRef]:
    found = detect(location)
    kind, entries = found.kind, found.entries
    if kind == "legacy":
        raise legacy_msgpack_error(location)
    root: Location | None = None
    if kind == "item":
        if step is not None:
            raise UsageError(f"--step does not apply to the item directory {location}")
        parsed = parse_step_name(location.parent.name)
        # Outside a step, the directory is a single-item Checkpointer's save: its one item is
        # called `default` (what a CheckpointManager names an unnamed item).
        name = location.name if parsed is not None else "default"
        if item not in (None, ALL_ITEMS, name, location.name):
            raise UsageError(f"{location} is the item {name!r}, not {item!r}")
        return ItemRef(location, name, parsed.step if parsed else None, location.parent, None)
    if kind == "root":
        root = location
        ref = find_step(root, found.steps or [], step)
        step_loc, children = ref.location, list(ref.children)
        step_num: int | None = ref.step
        deleting = ref.deleting
    else:
        parsed = parse_step_name(location.name)
        step_num = parsed.step if parsed else None
        if step is not None and step != step_num:
            raise UsageError(f"{location} is a step directory; --step {step} does not apply to it")
        step_loc, children = location, entries
        deleting = step_ref(location, entries).deleting
    meta = read_step_metadata(step_loc)
    items = [i for i in step_items(step_loc, children, meta.item_handlers) if i not in deleting]
    if item in deleting:
        raise NotACheckpointError(
            f"item {item!r} of {step_loc} is being deleted ({DELETION_RECORD}): Orbax refuses "
            "to load it (DeletionInProgressError) and restores the step without it",
            hint=f"items: {', '.join(items) or 'none'}",
        )
    if not items:
        raise NotACheckpointError(f"{step_loc} holds no items")
    if item is ALL_ITEMS:
        return [
            ItemRef(item_location(step_loc, n, items), n, step_num, step_loc, root) for n in items
        ]
    name = choose_item(items, item, step_loc, lambda n: item_kind(step_loc, n, meta.item_handlers))
    return ItemRef(item_location(step_loc, name, items), name, step_num, step_loc, root)


def resolve_items(location: Location, step: int | None = None) -> list[ItemRef]:
    """Every item of the step a root (``step``, default the latest committed one) or a step
    directory resolves to, ``metrics`` included; an item directory is its one item."""
    found = _resolve(location, step, ALL_ITEMS)
    return found if isinstance(found, list) else [found]


def resolve_trees(
    location: Location, step: int | None = None, item: str | None = None
) -> list[ItemRef]:
    """``resolve_item``, except that a step of several PyTree items and no ``item`` resolves
    to every one of them (in the step's order): what the writers rewrite together."""
    try:
        return [resolve_item(location, step, item)]
    except SeveralItemsError as several:
        if item is not None:
            raise
        chosen = set(several.items)
        refs = [r for r in resolve_items(location, step) if r.name in chosen]
        trees = [r for r in refs if r.step_location is not None and _is_tree(r)]
        if len(trees) < 2:
            raise
        return trees


def _is_tree(ref: ItemRef) -> bool:
    assert ref.step_location is not None
    handlers = read_step_metadata(ref.step_location).item_handlers
    return item_kind(ref.step_location, ref.name, handlers) == "pytree"
