"""Restore checkpoints with the installed Orbax (0.12.8), many per process: a line server.

    python tests/support/orbax_server.py       # reads one JSON request per line on stdin

Requests: ``{"op": "item", "path": P, "kind": "pytree" | "array" | "json"}`` restores one item
without a target, as the matrix truth was made (``truth.json``); ``{"op": "steps", "path": R}``
is ``CheckpointManager(R).all_steps()`` (``"options"``: its ``step_prefix`` and
``step_format_fixed_length``, as the root was saved). Two restore a step by its item names, as a
framework does: ``{"op": "manager", "path": R, "step": N, "items": {NAME: "pytree" | "json"},
"options": ...}`` through ``CheckpointManager.restore`` with ``StandardRestore``/``JsonRestore``
per name (Kauldron's way), ``{"op": "checkpointables", "path": R, "step": N}`` through the v1
API's ``training.Checkpointer(R).load_checkpointables(N)`` (MaxText's way). Each answer is one JSON line: ``{"ok": true, ...}``
with the restored leaves described by ``fixtures/matrix/cases.py``'s own ``walk`` (keypath,
kind, dtype, shape, sha256 of the C-order bytes, key data for typed keys), or ``{"ok": false,
"error": FIRST_LINE}``. Importing JAX and Orbax once for a few hundred restores is what keeps
the matrix tests fast; the process runs with 8 forced CPU devices, so sharded outputs restore
on their mesh.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_ENABLE_X64"] = "1"  # float64/int64 jax.Arrays restore as themselves

import logging
import warnings
from pathlib import Path
from typing import Any

logging.disable(logging.WARNING)
warnings.simplefilter("ignore")  # "Sharding info not provided": restoring without a target is meant

import orbax.checkpoint as ocp  # noqa: E402

# The truth's own description of restored values (fixtures/matrix/cases.py, which runs on every
# release): the same keypaths, kinds, dtypes, shapes and digests, compared one to one.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "matrix"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cases import walk  # noqa: E402

from tests.support.line_server import serve  # noqa: E402


def restore_item(path: Path, kind: str) -> dict[str, Any]:
    if kind == "json":
        name = "metrics" if (path / "metrics").is_file() else "metadata"
        value = ocp.Checkpointer(ocp.JsonCheckpointHandler(filename=name)).restore(path)
        return {"value": value}
    if kind == "array":
        value = ocp.Checkpointer(ocp.ArrayCheckpointHandler()).restore(path)
        return {"leaves": walk(value)}
    return {"leaves": walk(ocp.PyTreeCheckpointer().restore(path))}


def restore_named(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """A step's items by name, each described as ``restore_item`` describes one item."""
    if request["op"] == "checkpointables":
        from orbax.checkpoint.experimental import v1

        with v1.training.Checkpointer(path) as ckptr:
            loaded = ckptr.load_checkpointables(request["step"])
        return {"items": {name: {"leaves": walk(value)} for name, value in loaded.items()}}
    kinds: dict[str, str] = request["items"]
    args = {
        name: ocp.args.JsonRestore() if kind == "json" else ocp.args.StandardRestore()
        for name, kind in kinds.items()
    }
    options = ocp.CheckpointManagerOptions(create=False, **request.get("options", {}))
    with ocp.CheckpointManager(path, options=options, item_names=tuple(kinds)) as mgr:
        got = mgr.restore(request["step"], args=ocp.args.Composite(**args))
    return {
        "items": {
            name: {"value": got[name]} if kind == "json" else {"leaves": walk(got[name])}
            for name, kind in kinds.items()
        }
    }


def answer(request: dict[str, Any]) -> dict[str, Any]:
    path = Path(request["path"]).resolve()  # Orbax wants absolute paths
    if request["op"] in ("manager", "checkpointables"):
        return restore_named(path, request)
    if request["op"] == "steps":
        options = ocp.CheckpointManagerOptions(create=False, **request.get("options", {}))
        mgr = ocp.CheckpointManager(path, options=options)
        try:
            return {"steps": sorted(mgr.all_steps())}
        finally:
            mgr.close()
    return restore_item(path, request.get("kind", "pytree"))


def main() -> int:
    return serve(answer, {"orbax": ocp.__version__})


if __name__ == "__main__":
    sys.exit(main())
