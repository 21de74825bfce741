"""Ground truth for tests: what real Orbax (or Flax, for the msgpack layout) restores from an item.

``restore_leaves(item_dir)`` restores every array and scalar leaf into host numpy (no target
mesh, so any topology restores) and returns them by dotted leaf name, the names ``ckpt inspect``
shows. Items Orbax cannot open itself (``unmerged_ocdbt``, the pre-0.4.4 layout) are compared
with the checkpoint they were derived from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Fixtures whose values Orbax cannot restore in place, and the fixture holding the same values.
DERIVED_FROM = {"unmerged_ocdbt": "multiprocess"}


def _name(path: Any) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def restore_leaves(item: Path) -> dict[str, Any]:
    """Every array/scalar leaf of an Orbax item directory, restored by Orbax into numpy."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    item = item.absolute()
    if (item / "checkpoint").is_file() and not (item / "_METADATA").exists():
        from flax import serialization

        tree = serialization.msgpack_restore((item / "checkpoint").read_bytes())
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {_name(p): np.asarray(v) for p, v in flat}
    handler = ocp.PyTreeCheckpointHandler()
    meta = handler.metadata(item)
    tree = getattr(meta, "tree", meta)

    def restore_arg(m: Any) -> Any:
        if type(m).__name__ in ("ArrayMetadata", "NumpyMetadata", "ScalarMetadata"):
            return ocp.RestoreArgs(restore_type=np.ndarray)
        return ocp.RestoreArgs()

    args = jax.tree.map(restore_arg, tree, is_leaf=lambda x: not isinstance(x, (dict, list, tuple)))
    with ocp.Checkpointer(handler) as ckptr:
        restored = ckptr.restore(item, args=ocp.args.PyTreeRestore(restore_args=args))
    flat = jax.tree_util.tree_flatten_with_path(restored)[0]
    return {_name(p): np.asarray(v) for p, v in flat if not isinstance(v, str)}


def same_bytes(a: Any, b: Any) -> bool:
    """Equal dtype, shape and bytes (bfloat16 and NaNs compared as raw bytes)."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def orbax_restores(root: Path, abstract: Any) -> tuple[bool, Any]:
    """What the user's restore into ``abstract`` does: True when ``CheckpointManager.restore``
    with ``StandardRestore`` succeeds with the target's shapes and dtypes (Orbax 0.12 returns the
    stored shape to an unsharded target silently: that counts as a failure), and what it returned."""
    import jax
    import orbax.checkpoint as ocp

    try:
        with ocp.CheckpointManager(str(root)) as mgr:
            got = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore(abstract))
    except Exception:  # Orbax refusing is the fact under test
        return False, None
    want = jax.tree.leaves(jax.tree.map(lambda a: (a.shape, a.dtype), abstract))
    have = jax.tree.leaves(jax.tree.map(lambda a: (a.shape, a.dtype), got))
    return bool(want) and want == have, got
