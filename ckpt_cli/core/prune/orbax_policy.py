"""``PinnedSteps``: make a training job's own ``CheckpointManager`` keep the steps pinned with
``ckpt pin``.

Orbax deletes old steps itself (``max_to_keep``, ``best_fn``...), and it knows nothing of ckpt's
pin files. Its preservation policies are a protocol (``should_preserve(checkpoints, *,
context)``), so a policy that looks at the pins at each decision is enough::

    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers as cm
    from ckpt_cli.core.prune.orbax_policy import PinnedSteps

    options = ocp.CheckpointManagerOptions(
        preservation_policy=cm.AnyPreservationPolicy([cm.LatestN(3), PinnedSteps(workdir)])
    )

Nothing here imports Orbax: the protocol is duck-typed, so this module costs nothing to import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_cli.core.format.discovery import list_steps
from ckpt_cli.core.format.pins import has_pin_file
from ckpt_cli.core.storage import StorageOptions, open_location


class PinnedSteps:
    """Preserve every step of ``directory`` that carries a ckpt pin (read afresh each time);
    ``storage`` says how to reach it on an object store (default: the environment)."""

    def __init__(self, directory: Any, storage: StorageOptions | None = None) -> None:
        self.directory = str(directory)
        self.storage = storage

    def pinned(self) -> set[int]:
        root = open_location(self.directory, self.storage)
        root.refresh()  # a pin written since the last decision must be seen
        if not root.exists():
            return set()
        return {s.step for s in list_steps(root, root.list()) if has_pin_file(s.children)}

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any = None) -> list[bool]:
        pinned = self.pinned()
        return [int(c.step) in pinned for c in checkpoints]
