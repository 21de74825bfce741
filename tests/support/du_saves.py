"""Real Orbax saves for ``ckpt du``'s tests: a ``CheckpointManager`` root, one PyTree item per
step, in each of the four layouts (OCDBT or not, zarr2 or zarr3), with a leaf whose values are
the same in every step (a frozen leaf)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

LAYOUTS = {
    "ocdbt-zarr2": {"use_ocdbt": True, "use_zarr3": False},
    "ocdbt-zarr3": {"use_ocdbt": True, "use_zarr3": True},
    "plain-zarr2": {"use_ocdbt": False, "use_zarr3": False},
    "plain-zarr3": {"use_ocdbt": False, "use_zarr3": True},
}
#: Leaf name -> (shape, dtype) of the saved tree; logical bytes follow.
TREE = {
    "params.dense.kernel": ((64, 48), "float32"),
    "params.dense.bias": ((48,), "float32"),
    "params.embed": ((40, 16), "bfloat16"),
    "params.frozen": ((24, 8), "float32"),
    "step": ((), "int32"),
}


def _tree(seed: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import ml_dtypes

    rng = np.random.default_rng(seed)
    return {
        "params": {
            "dense": {
                "kernel": jnp.asarray(rng.standard_normal((64, 48), dtype=np.float32)),
                "bias": jnp.asarray(rng.standard_normal(48, dtype=np.float32)),
            },
            "embed": jnp.asarray(rng.standard_normal((40, 16)).astype(ml_dtypes.bfloat16)),
            # The same values in every step: a frozen leaf.
            "frozen": jnp.asarray(np.random.default_rng(7).standard_normal((24, 8), np.float32)),
        },
        "step": jnp.int32(seed),
    }


def save(root: Path, layout: str, steps: tuple[int, ...] = (1, 2)) -> Path:
    """A CheckpointManager root, one PyTree item per step, as Orbax's docs show."""
    import orbax.checkpoint as ocp

    handler = ocp.PyTreeCheckpointHandler(**LAYOUTS[layout])
    with ocp.CheckpointManager(root, item_handlers=handler) as m:
        for step in steps:
            m.save(step, args=ocp.args.PyTreeSave(_tree(step)))
        m.wait_until_finished()
    return root
