"""What an item of a step is: told from what its directory holds and from the handler its step
recorded (``_CHECKPOINT_METADATA.item_handlers``), never from one layout rule.

Frameworks put items into a step that no Orbax handler of ckpt's knowledge wrote: Kauldron's
``ds_iter`` (``kauldron.data.iterators.noop_handler.NoopHandler``: an empty directory, or one
holding only Orbax's ``commit_success.txt``), grain's iterator states, JSON items, the v1 API's
``metrics`` checkpointable, and any handler a user registers. Each kind is handled on its own
terms by every command:

- ``pytree``: ``_METADATA`` and its arrays (StandardSave, PyTreeSave, the v1 ``PyTreeHandler``).
  An item of strings, ``None`` and empty containers only has no OCDBT database even when its
  ``_METADATA`` says ``use_ocdbt`` (Orbax 0.12.8 opens one only for array and scalar leaves).
- ``array``: one array (ArraySave).
- ``json``: a JsonSave item, ``metrics``, grain's per-process states.
- ``empty``: nothing but (at most) the commit marker, under a no-op handler or none recorded:
  checked for existence only, carried as it is.
- ``unknown``: files of a handler ckpt does not know: named in reports (a note), carried byte
  for byte by every writer, never called damage.

A directory whose handler is one of Orbax's tree, array or JSON handlers keeps that kind even
when its files are gone: Orbax refuses to save an empty PyTree (``Found empty item``), so such
an item emptied is damage, which verify reports.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from ckpt_cli.core.format.emergency import is_process_metadata_handler
from ckpt_cli.core.format.names import (
    ARRAY_ITEM_DIR,
    COMMIT_MARKER,
    MANIFEST,
    TREE_METADATA,
    is_grain_handler,
    is_process_db,
    json_item_files,
    looks_like_item,
)
from ckpt_cli.core.format.ocdbt import DATA_DIRS
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError

ItemKind = Literal["pytree", "array", "json", "empty", "unknown"]

#: Files that hold no content of an item: Orbax's commit marker, ckpt's digest record and
#: verify state (``digest/records.py`` names them; spelled here to keep imports one way).
BOOKKEEPING = frozenset({COMMIT_MARKER, "_CKPT_DIGESTS.json", "_CKPT_VERIFY_STATE.json"})
#: Files that make a PyTree item without arrays: its tree, its strings, its (empty) shardings.
_TREE_ONLY = frozenset({TREE_METADATA, "_strings.json", "_sharding", "array_metadatas"})

# Handler class names (the last dotted component, as Orbax records ``module.Class``).
_TREE_HANDLERS = frozenset(
    {
        "StandardCheckpointHandler",
        "PyTreeCheckpointHandler",
        "BasePyTreeCheckpointHandler",
        "PyTreeHandler",  # the v1 API's (orbax.checkpoint.experimental.v1 / orbax.checkpoint.v1)
    }
)
_ARRAY_HANDLERS = frozenset({"ArrayCheckpointHandler"})
_JSON_HANDLERS = frozenset({"JsonCheckpointHandler", "JsonHandler", "MetricsHandler"})


def handler_class(handler: str | None) -> str | None:
    """The class name of a recorded handler (``a.b.NoopHandler`` -> ``NoopHandler``)."""
    return handler.rsplit(".", 1)[-1] if handler else None


def is_noop_handler(handler: str | None) -> bool:
    """A handler that saves nothing (Kauldron's ``NoopHandler``, any ``...NoopHandler``)."""
    name = handler_class(handler)
    return name is not None and name.lower().endswith(("noophandler", "noopcheckpointhandler"))


def handler_kind(handler: str | None) -> ItemKind | None:
    """The kind an Orbax (or grain) handler's items always are; None for any other handler."""
    name = handler_class(handler)
    if name is None:
        return None
    if name in _ARRAY_HANDLERS:
        return "array"
    if name in _JSON_HANDLERS or is_grain_handler(handler):
        return "json"
    if name in _TREE_HANDLERS:
        return "pytree"
    return None


def content(names: Collection[str]) -> frozenset[str]:
    """The names of a listing that hold an item's content (bookkeeping files aside)."""
    return frozenset(n for n in names if n not in BOOKKEEPING)


def classify(names: Collection[str], handler: str | None) -> ItemKind:
    """The kind of an item whose directory lists ``names`` (top level) and whose step
    recorded ``handler`` (None: not recorded)."""
    held = content(names)
    known = handler_kind(handler)
    if known is not None and (known != "pytree" or TREE_METADATA in held or not held):
        return known
    if TREE_METADATA in held:
        return "pytree"
    if not held:
        return "empty"
    if json_item_files(held):
        return "json"
    if looks_like_item(held) or ARRAY_ITEM_DIR in held:
        # ArraySave before 0.12 (`checkpoint/` or a database, no _METADATA); a tree handler's
        # item that lost its _METADATA is still a tree item (verify says what is missing).
        return known or "array"
    return known or "unknown"


def step_handler(handlers: dict[str, str] | str | None, name: str) -> str | None:
    """The handler the step recorded for item ``name`` (a lone string: the step's one item)."""
    if isinstance(handlers, dict):
        value = handlers.get(name)
        return value if isinstance(value, str) else None
    return handlers if isinstance(handlers, str) else None


def item_kind(step_loc: Location, name: str, handlers: dict[str, str] | str | None) -> ItemKind:
    """What item ``name`` of a step holds, from its listing and the handler the step recorded;
    ``unknown`` when it cannot be listed."""
    handler = step_handler(handlers, name)
    try:
        names = [e.name for e in step_loc.child(name).list()]
    except CkptError:
        return handler_kind(handler) or "unknown"
    return classify(names, handler)


def holds_arrays(names: Collection[str]) -> bool:
    """Whether a PyTree item's listing shows stored arrays (a database or an array directory),
    unlike an item of strings and scalars-free leaves (a Keras ``model_config``): what makes
    it the step's state rather than its configuration."""
    held = content(names)
    if MANIFEST in held or held & DATA_DIRS or any(is_process_db(n) for n in held):
        return True
    return any(n not in _TREE_ONLY for n in held)


def describe(kind: ItemKind, handler: str | None) -> str:
    """One phrase for an item that holds nothing ckpt reads (``empty``/``unknown``)."""
    by = f" ({handler})" if handler else ""
    if is_process_metadata_handler(handler):
        return (
            "process metadata of Orbax's emergency checkpoint manager (device ids per process): "
            "this step is one host's local tier, holding only that host's shards; carried "
            "byte for byte"
        )
    if kind == "empty":
        return f"empty item{by}: nothing saved, checked for existence only, carried as it is"
    return (
        f"item of a handler ckpt does not know{by}: not checked, carried byte for byte; "
        "restore it with that handler"
    )
