"""A step written so that no reader takes it for a finished one before it is (see StepWriter)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    STEP_METADATA,
    TMP_MARKER,
    WRITING_MARKER,
    check_plain_name,
    parse_step_name,
)
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.claim import OWNER_FILE, WriteClaim, claim_root, read_owner
from ckpt_cli.core.write.item import STANDARD_HANDLER
from ckpt_cli.errors import NotFoundError, RefusedError, StorageError


class StepWriter:
    """A step written so that no reader ever takes it for a finished one before it is.

    Locally (rename): under its tmp name, committed with ``commit_success.txt``, then renamed, as
    Orbax does. Object stores (no rename, ``requires_commit_marker``): in place under its final
    name with a ``.ckpt-writing`` object first, ``commit_success.txt`` put last, as Orbax does
    on GCS; until the marker lands the step is ``uncommitted``.
    """

    def __init__(self, root: Location, step_name: str, command: str = "ckpt") -> None:
        self.root = root
        self.step_name = step_name
        self.command = command
        self.final = root.child(step_name)
        self.in_place = root.requires_commit_marker
        # A name of its own (the older Orbax eras' `-<digits>` suffix, which Orbax and ckpt
        # read as an unfinished save): never the directory of another writer or of a trainer.
        self.tmp = (
            self.final
            if self.in_place
            else root.child(f"{step_name}{TMP_MARKER}-{time.time_ns() // 1000}")
        )
        self.init_ns = time.time_ns()
        # One handler name (a str) when the step is its own one item, as Orbax records it.
        self.handlers: dict[str, str] | str = {}
        self._started = False
        #: Items copied from a source item that holds no file (``copy_item`` counts them).
        self.empty_items: set[str] = set()
        self._claim: WriteClaim | None = None
        self._undo_dirs: Callable[[], None] = lambda: None

    def begin(self) -> None:
        """Create the root if needed, claim it (a second writer is refused here), clear this
        step's leftovers whose owner is provably gone, and create the tmp step holding our
        owner record. A failure here (a full disk) undoes all of it, as ``abort`` does."""
        self._undo_dirs = self.root.make_dirs_undoable()
        try:
            self._claim = claim_root(self.root, self.command)
            self._begin()
        except BaseException:
            self.abort()
            raise

    def _begin(self) -> None:
        assert self._claim is not None
        owner = self._claim.owner.to_text().encode()
        if self.in_place and self._left_by_ckpt():
            # An earlier ckpt write that died (we hold the root: no ckpt writer is alive).
            self.final.delete_tree(first=(COMMIT_MARKER,))
        if self.final.exists():
            raise self._taken()
        if not self.in_place:
            self._remove_dead_leftovers()
        self.tmp.make_dirs()
        self._started = True
        self.tmp.child(WRITING_MARKER if self.in_place else OWNER_FILE).write_bytes(owner)

    def refusal(self) -> RefusedError | None:
        """Why ``begin`` would refuse this step, asked before anything is shown or written:
        the destination holds a step of its name (but a dead ckpt write in a bucket, which
        ``begin`` clears). ``begin`` checks again under the root's claim."""
        if not self.final.exists() or (self.in_place and self._left_by_ckpt()):
            return None
        return self._taken()

    def _taken(self) -> RefusedError:
        return RefusedError(  # a refusal (exit 3), scripts see code "refused"
            f"{self.final} already exists",
            hint="choose another destination; ckpt never overwrites a step",
        )

    def _remove_dead_leftovers(self) -> None:
        """Tmp dirs of this step that a ckpt writer made (they hold its owner record): under
        the root's lock their writer cannot be alive. Anything else (a trainer's save) stays."""
        for entry in self.root.list():
            parsed = parse_step_name(entry.name)
            if entry.is_symlink or not entry.is_dir or parsed is None or not parsed.tmp:
                continue
            if entry.name.split(TMP_MARKER, 1)[0] != self.step_name:
                continue
            leftover = self.root.child(entry.name)
            if read_owner(leftover.child(OWNER_FILE)) is not None:
                leftover.delete_tree()

    def _left_by_ckpt(self) -> bool:
        return self.final.child(WRITING_MARKER).is_file() and not (
            self.final.child(COMMIT_MARKER).is_file()
        )

    def item(self, name: str, handler: str = STANDARD_HANDLER) -> Location:
        check_plain_name(name, "item name", self.tmp)  # every item dir lies inside the step
        assert isinstance(self.handlers, dict), "the step is already its own one item"
        self.handlers[name] = handler
        loc = self.tmp.child(name)
        loc.make_dirs()
        return loc

    def top_item(self, handler: str = STANDARD_HANDLER) -> Location:
        """The step itself as its one item (no item directory), as a Checkpointer without a
        CheckpointManager item name writes it (``flax.training.checkpoints``)."""
        assert not self.handlers, "the step already has items"
        self.handlers = handler
        return self.tmp

    def commit(
        self,
        custom_metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        *,
        before_marker: Callable[[], None] | None = None,
    ) -> Location:
        """Write the step's metadata, then (``before_marker``: a last write that must see it,
        such as the digest record of a step that is its own item) the commit marker."""
        self._check_intact()
        self.tmp.child(STEP_METADATA).write_bytes(
            json.dumps(
                {
                    "item_handlers": self.handlers,
                    "metrics": metrics or {},
                    "performance_metrics": {},
                    "init_timestamp_nsecs": self.init_ns,
                    "commit_timestamp_nsecs": time.time_ns(),
                    "custom_metadata": custom_metadata or {},
                }
            ).encode()
        )
        try:
            self.tmp.child(WRITING_MARKER if self.in_place else OWNER_FILE).delete_file()
            if before_marker is not None:
                before_marker()
            # Every file on disk before the marker says the step is whole: the arrays'
            # TensorStore writes are not synced one by one (``item.writer_context``).
            self.tmp.sync_tree()
            self.tmp.child(COMMIT_MARKER).write_bytes(
                f"Checkpoint commit was successful to {self.final}".encode()
            )
            if not self.in_place:
                self.tmp.rename(self.final.name)
        finally:
            self._release()
        return self.final

    def _check_intact(self) -> None:
        """Just before the markers, one fresh listing of the step: this writer's record and
        every item it wrote are still there. Something that deleted the step's files meanwhile
        (a prune that did not see the claim, a person) fails the write (exit 3) instead of
        leaving a committed step without them."""
        self.tmp.refresh()
        try:
            names = {rel.split("/", 1)[0] for rel, _ in self.tmp.walk()}
            # An item written empty (a no-op handler's) has no file for the walk to find.
            names |= {e.name for e in self.tmp.list() if e.is_dir}
        except NotFoundError:
            names = set()
        mine = WRITING_MARKER if self.in_place else OWNER_FILE
        items = self.handlers if isinstance(self.handlers, dict) else ()
        # On an object store an empty item is no object at all: nothing to find there.
        empty = self.empty_items if self.in_place else set()
        gone = [n for n in (mine, *items) if n not in names and n not in empty]
        if gone:  # the caller's abort removes what is left and gives up the claim
            raise StorageError(
                f"{self.tmp.child(gone[0])} is gone just before step {self.step_name} was "
                "committed (deleted by another process): the step is not committed",
                hint=f"rerun the {self.command}",
            )

    def abort(self) -> None:
        """Remove the tmp step, give up the root, and remove the root again if ``begin``
        created it and nothing else was put there since."""
        try:
            if self._started and self.tmp.exists():
                self.tmp.delete_tree(first=(COMMIT_MARKER,))
        finally:
            self._release()
            undo, self._undo_dirs = self._undo_dirs, lambda: None
            undo()

    def _release(self) -> None:
        if self._claim is not None:
            claim, self._claim = self._claim, None
            claim.release()
