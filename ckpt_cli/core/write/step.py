"""A step written so that no reader takes it for a finished one before it is (see StepWriter)."""

from __future__ import annotations

import json
import time
from typing import Any

from ckpt_cli.core.format.names import COMMIT_MARKER, STEP_METADATA, TMP_MARKER, WRITING_MARKER
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.item import STANDARD_HANDLER


class StepWriter:
    """A step written so that no reader ever takes it for a finished one before it is.

    Locally (rename): under its tmp name, committed with ``commit_success.txt``, then renamed, as
    Orbax does. Object stores (no rename, ``requires_commit_marker``): in place under its final
    name with a ``.ckpt-writing`` object first, ``commit_success.txt`` put last, as Orbax does
    on GCS; until the marker lands the step is ``uncommitted``.
    """

    def __init__(self, root: Location, step_name: str) -> None:
        self.root = root
        self.final = root.child(step_name)
        self.in_place = root.requires_commit_marker
        self.tmp = self.final if self.in_place else root.child(step_name + TMP_MARKER)
        self.init_ns = time.time_ns()
        self.handlers: dict[str, str] = {}
        self._started = False

    def begin(self) -> None:
        from ckpt_cli.errors import NotACheckpointError

        if self.in_place and self._left_by_ckpt():
            self.final.delete_tree(
                first=(COMMIT_MARKER,)
            )  # an earlier ckpt write of ours that died: never committed
        if self.final.exists():
            raise NotACheckpointError(
                f"{self.final} already exists",
                hint="choose another destination; ckpt never overwrites a step",
            )
        if not self.in_place and self.tmp.exists():
            self.tmp.delete_tree()  # an earlier ckpt run of ours that died: never a valid step
        self.tmp.make_dirs()
        self._started = True
        if self.in_place:
            self.tmp.child(WRITING_MARKER).write_bytes(b"ckpt is writing this step")

    def _left_by_ckpt(self) -> bool:
        return self.final.child(WRITING_MARKER).is_file() and not (
            self.final.child(COMMIT_MARKER).is_file()
        )

    def item(self, name: str, handler: str = STANDARD_HANDLER) -> Location:
        self.handlers[name] = handler
        loc = self.tmp.child(name)
        loc.make_dirs()
        return loc

    def commit(
        self, custom_metadata: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None
    ) -> Location:
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
        if self.in_place:
            self.tmp.child(WRITING_MARKER).delete_file()
        self.tmp.child(COMMIT_MARKER).write_bytes(
            f"Checkpoint commit was successful to {self.final}".encode()
        )
        if not self.in_place:
            self.tmp.rename(self.final.name)
        return self.final

    def abort(self) -> None:
        if self._started and self.tmp.exists():
            self.tmp.delete_tree(first=(COMMIT_MARKER,))
