"""Restore checkpoints with the installed Orbax (0.12.8), many per process: a line server.

    python tests/matrix/orbax_server.py       # reads one JSON request per line on stdin

Requests: ``{"op": "item", "path": P, "kind": "pytree" | "array" | "json"}`` restores one item
without a target, as the matrix truth was made (``truth.json``); ``{"op": "steps", "path": R}``
is ``CheckpointManager(R).all_steps()``. Each answer is one JSON line: ``{"ok": true, ...}``
with the restored leaves described like ``fixtures/matrix/cases.py`` describes them (keypath,
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

import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

logging.disable(logging.WARNING)
warnings.simplefilter("ignore")  # "Sharding info not provided": restoring without a target is meant

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402


def _typed_key(x: Any) -> bool:
    try:
        return bool(jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key))
    except Exception:
        return False


def leaf_record(value: Any) -> dict[str, Any]:
    if value is None:
        return {"kind": "none"}
    if isinstance(value, str):
        return {"kind": "string", "value": value}
    rec: dict[str, Any] = {}
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
        rec["kind"] = "python_" + type(value).__name__
    else:
        rec["kind"] = "jax.Array" if isinstance(value, jax.Array) else type(value).__name__
    if _typed_key(value):
        rec["kind"] = "typed_key"
        rec["key_impl"] = str(jax.random.key_impl(value))
        rec["key_shape"] = list(value.shape)
        value = jax.random.key_data(value)
    a = np.array(np.asarray(value), order="C", copy=True)
    rec["dtype"] = str(a.dtype)
    rec["shape"] = list(a.shape)
    rec["sha256"] = hashlib.sha256(a.tobytes()).hexdigest()
    sharding = getattr(value, "sharding", None)
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is not None and mesh is not None:
        rec["sharding"] = {
            "mesh": {str(k): int(v) for k, v in mesh.shape.items()},
            "spec": [list(p) if isinstance(p, tuple) else p for p in spec],
        }
    return rec


def walk(tree: Any, path: tuple[tuple[str, int], ...] = ()) -> list[dict[str, Any]]:
    """Every leaf and every empty node of a restored tree, with its keypath."""
    out: list[dict[str, Any]] = []
    if isinstance(tree, dict) or (
        hasattr(tree, "items") and hasattr(tree, "keys") and not hasattr(tree, "shape")
    ):
        items = list(tree.items())
        if not items:
            out.append({"keypath": [list(p) for p in path], "kind": "empty_dict"})
        for k, v in items:
            out.extend(walk(v, (*path, (str(k), 2))))
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        if not tree:
            kind = "empty_list" if isinstance(tree, list) else "empty_tuple"
            out.append({"keypath": [list(p) for p in path], "kind": kind})
        for i, v in enumerate(tree):
            out.extend(walk(v, (*path, (str(i), 1))))
        return out
    if hasattr(tree, "_fields"):
        for f in tree._fields:
            out.extend(walk(getattr(tree, f), (*path, (f, 2))))
        return out
    rec = leaf_record(tree)
    rec["keypath"] = [list(p) for p in path]
    out.append(rec)
    return out


def restore_item(path: Path, kind: str) -> dict[str, Any]:
    if kind == "json":
        name = "metrics" if (path / "metrics").is_file() else "metadata"
        value = ocp.Checkpointer(ocp.JsonCheckpointHandler(filename=name)).restore(path)
        return {"value": value}
    if kind == "array":
        value = ocp.Checkpointer(ocp.ArrayCheckpointHandler()).restore(path)
        return {"leaves": walk(value)}
    return {"leaves": walk(ocp.PyTreeCheckpointer().restore(path))}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    path = Path(request["path"]).resolve()  # Orbax wants absolute paths
    if request["op"] == "steps":
        mgr = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False))
        try:
            return {"steps": sorted(mgr.all_steps())}
        finally:
            mgr.close()
    return restore_item(path, request.get("kind", "pytree"))


def main() -> int:
    print(json.dumps({"ok": True, "ready": True, "orbax": ocp.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = {"ok": True, **answer(json.loads(line))}
        except Exception as e:
            text = str(e).strip().splitlines()
            out = {"ok": False, "error": f"{type(e).__name__}: {text[0] if text else ''}"[:500]}
        print(json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
