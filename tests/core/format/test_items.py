"""What an item is, from its listing and the handler its step recorded (``format/items.py``)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.digest.records import DIGEST_FILE, STATE_FILE
from ckpt_cli.core.format.items import (
    BOOKKEEPING,
    classify,
    handler_kind,
    holds_arrays,
    is_noop_handler,
)
from ckpt_cli.core.format.names import COMMIT_MARKER

KAULDRON_NOOP = "kauldron.data.iterators.noop_handler.NoopHandler"
STANDARD = "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
PYTREE = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
V1_PYTREE = "orbax.checkpoint.experimental.v1._src.handlers.pytree_handler.PyTreeHandler"
V1_METRICS = "orbax.checkpoint.experimental.v1._src.handlers.json_handler.MetricsHandler"
JSON = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
ARRAY = "orbax.checkpoint._src.handlers.array_checkpoint_handler.ArrayCheckpointHandler"
GRAIN = "grain._src.python.checkpoint.handler.CheckpointHandler"


def test_bookkeeping_names_are_the_digest_files() -> None:
    assert {DIGEST_FILE, STATE_FILE, COMMIT_MARKER} == BOOKKEEPING


@pytest.mark.parametrize(
    ("names", "handler", "kind"),
    [
        # Kauldron's ds_iter: empty, or only Orbax's commit file in it
        ([], KAULDRON_NOOP, "empty"),
        ([COMMIT_MARKER], KAULDRON_NOOP, "empty"),
        ([COMMIT_MARKER], "my.module.Whatever", "empty"),
        ([], None, "empty"),
        # a no-op handler whose directory holds something: not ours to judge
        (["state.bin"], KAULDRON_NOOP, "unknown"),
        (["blob.bin", "note.txt", COMMIT_MARKER], "my.module.BlobHandler", "unknown"),
        # Keras's model_config: a tree of one string, no database
        (["_METADATA", "_strings.json", COMMIT_MARKER], PYTREE, "pytree"),
        (["_METADATA", "manifest.ocdbt", "d"], V1_PYTREE, "pytree"),
        # a subclass of an Orbax tree handler: told by its files
        (["_METADATA", "manifest.ocdbt", "d"], "my.module.CustomTreeHandler", "pytree"),
        (["metrics", COMMIT_MARKER], V1_METRICS, "json"),
        (["metadata"], JSON, "json"),
        (["process_0-of-1.json"], GRAIN, "json"),
        (["process_0-of-1.json"], None, "json"),
        (["_METADATA", "d", "manifest.ocdbt"], ARRAY, "array"),
        (["checkpoint"], None, "array"),
        # an Orbax tree item emptied is damage (Orbax refuses to save an empty tree), not empty
        ([COMMIT_MARKER], STANDARD, "pytree"),
        (["d", "manifest.ocdbt"], STANDARD, "pytree"),
        ([], JSON, "json"),
    ],
)
def test_an_item_is_told_by_its_files_and_its_handler(
    names: list[str], handler: str | None, kind: str
) -> None:
    assert classify(names, handler) == kind


def test_handlers_of_known_kinds() -> None:
    assert handler_kind(STANDARD) == handler_kind(PYTREE) == handler_kind(V1_PYTREE) == "pytree"
    assert handler_kind(V1_METRICS) == handler_kind(JSON) == handler_kind(GRAIN) == "json"
    assert handler_kind(KAULDRON_NOOP) is None and handler_kind(None) is None
    assert is_noop_handler(KAULDRON_NOOP) and is_noop_handler("x.NoOpCheckpointHandler")
    assert not is_noop_handler(STANDARD) and not is_noop_handler(None)


def test_a_tree_of_strings_holds_no_arrays() -> None:
    assert not holds_arrays(["_METADATA", "_strings.json", COMMIT_MARKER])
    assert holds_arrays(["_METADATA", "manifest.ocdbt", "d", "ocdbt.process_0"])
    assert holds_arrays(["_METADATA", "params.w", "array_metadatas"])  # plain zarr


def test_the_v1_checkpointables_are_told_by_their_recorded_handlers() -> None:
    """The v1 API's ``state`` (PyTreeHandler) and ``metrics`` (MetricsHandler) checkpointables,
    as its training.Checkpointer wrote them (``fixtures/frameworks/orbax_v1``)."""
    from ckpt_cli.core.format.items import item_kind, step_handler
    from ckpt_cli.core.format.metadata import read_step_metadata
    from ckpt_cli.core.format.resolve import resolve_item, resolve_items
    from ckpt_cli.core.storage import LocalLocation
    from tests.support.paths import REPO

    root = LocalLocation(REPO / "fixtures" / "frameworks" / "orbax_v1" / "training")
    step = root.child("5")
    handlers = read_step_metadata(step).item_handlers
    assert handler_kind(step_handler(handlers, "state")) == "pytree"
    assert handler_kind(step_handler(handlers, "metrics")) == "json"
    assert item_kind(step, "state", handlers) == "pytree"
    assert item_kind(step, "metrics", handlers) == "json"
    assert resolve_item(root).name == "state"
    assert [r.name for r in resolve_items(root)] == ["metrics", "state"]
