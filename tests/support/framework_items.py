"""A step of the items frameworks put beside their state, saved by the installed Orbax.

- ``state``: arrays (StandardSave);
- ``model_config``: one string leaf (PyTreeSave), as Keras's ``OrbaxCheckpoint`` saves the
  model's config: ``_METADATA`` says ``use_ocdbt`` but Orbax 0.12.8 opens no database for an
  item without array or scalar leaves;
- ``counters``: Python scalars (PyTreeSave): these do go into a database;
- ``ds_iter``: ``NoopHandler``, Kauldron's no-op handler for an iterator it cannot save
  (``kauldron.data.iterators.noop_handler``): an empty directory (Orbax adds its commit file);
- ``blob``: ``BlobHandler``, a handler ckpt knows nothing of, writing a binary and a text file;
- ``extra``: a JsonSave item.

The two handlers live here so that Orbax restores the step in a test process by their recorded
names (``tests.support.framework_items.NoopHandler``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import orbax.checkpoint as ocp

CONFIG = json.dumps({"name": "mlp", "layers": [4, 3], "activation": "relu"})
BLOB = bytes(range(256)) * 3
STEPS = (1, 2)


class NoopHandler(ocp.CheckpointHandler):  # type: ignore[misc]
    """Saves nothing; restores what it is given (as Kauldron's ``NoopHandler`` does)."""

    def save(self, directory: Any, args: NoopArg) -> None:
        pass

    def restore(self, directory: Any, args: NoopArg) -> Any:
        return args.value


@ocp.args.register_with_handler(NoopHandler, for_save=True, for_restore=True)  # type: ignore[misc]
@dataclasses.dataclass
class NoopArg(ocp.args.CheckpointArgs):  # type: ignore[misc]
    value: Any = None


class BlobHandler(ocp.CheckpointHandler):  # type: ignore[misc]
    """A handler of its own format: ``blob.bin`` and ``note.txt``."""

    def save(self, directory: Any, args: BlobArg) -> None:
        (Path(directory) / "blob.bin").write_bytes(args.value)
        (Path(directory) / "note.txt").write_text("a handler of its own\n")

    def restore(self, directory: Any, args: BlobArg) -> Any:
        return (Path(directory) / "blob.bin").read_bytes()


@ocp.args.register_with_handler(BlobHandler, for_save=True, for_restore=True)  # type: ignore[misc]
@dataclasses.dataclass
class BlobArg(ocp.args.CheckpointArgs):  # type: ignore[misc]
    value: Any = None


def state_of(step: int) -> dict[str, np.ndarray]:
    return {
        "w": (np.arange(12, dtype=np.float32).reshape(4, 3) * step),
        "b": np.full(3, 0.5 * step, np.float32),
    }


def save_run(root: Path, steps: tuple[int, ...] = STEPS) -> Path:
    """Save ``steps`` of the items above into the CheckpointManager root ``root``."""
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as mgr:
        for step in steps:
            mgr.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state_of(step)),
                    model_config=ocp.args.PyTreeSave({"config": CONFIG}),
                    counters=ocp.args.PyTreeSave({"epoch": step, "lr": 0.125}),
                    ds_iter=NoopArg(None),
                    blob=BlobArg(BLOB),
                    extra=ocp.args.JsonSave({"epoch": step}),
                ),
            )
    return root


def restore_step(root: Path, step: int, *, items: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every item of ``step`` (or ``items``) as Orbax restores it, by its recorded handler."""
    wanted = {
        "state": ocp.args.StandardRestore(),
        "model_config": ocp.args.PyTreeRestore(),
        "counters": ocp.args.PyTreeRestore(),
        "ds_iter": NoopArg("restored-by-noop"),
        "blob": BlobArg(),
        "extra": ocp.args.JsonRestore(),
    }
    names = items or tuple(wanted)
    with ocp.CheckpointManager(root.absolute()) as mgr:
        got = mgr.restore(step, args=ocp.args.Composite(**{n: wanted[n] for n in names}))
    return {n: got[n] for n in names}
