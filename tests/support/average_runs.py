"""Runs saved at several steps for ``ckpt average``, by the installed Orbax as training loops
save them, and the restores a user does of an averaged step.

- ``linen_steps``: the linen ``TrainState`` of ``linen_train_state`` (BatchNorm statistics, an
  optax chain with Adam moments, a Python-int step) trained and saved at steps 1, 2, 3;
- ``mixed_steps``: a dict tree whose leaves are float32, bfloat16 and float64 parameters, an
  int32 counter, raw PRNG key data and Adam-like moments, saved at steps 10, 20, 30 with
  values that differ at every step;
- ``nnx_steps``: a flax.nnx model and its ``nnx.Optimizer`` saved as a Composite of two items
  (``model``, ``optimizer``) at steps 1, 2, 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from tests.support import linen_train_state as linen

LINEN_STEPS = (1, 2, 3)
MIXED_STEPS = (10, 20, 30)


def linen_steps(root: Path) -> list[Any]:
    """Train and save steps 1, 2, 3 of the linen TrainState; the states saved, in order."""
    state = linen.make_state()
    saved = []
    with ocp.CheckpointManager(str(root)) as mgr:
        for step in LINEN_STEPS:
            state, _ = linen.train_step(state, seed=step)
            mgr.save(step, args=ocp.args.StandardSave(state))
            saved.append(state)
        mgr.wait_until_finished()
    return saved


def mixed_tree(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step)
    return {
        "params": {
            "dense": {"kernel": jnp.asarray(rng.standard_normal((48, 40)), jnp.float32)},
            "embed": jnp.asarray(rng.standard_normal((32, 16)), jnp.bfloat16),
            "scale": jnp.asarray(rng.standard_normal(7), jnp.float64),
        },
        "counter": jnp.int32(step * 3),
        "rng": jnp.asarray(rng.integers(0, 2**31, 2), jnp.uint32),
        "opt_state": {"mu": jnp.asarray(rng.standard_normal((48, 40)), jnp.float32)},
    }


def mixed_steps(root: Path) -> list[dict[str, Any]]:
    """Save the mixed tree at steps 10, 20, 30; the trees saved, in order."""
    jax.config.update("jax_enable_x64", True)
    try:
        trees = [mixed_tree(step) for step in MIXED_STEPS]
        with ocp.CheckpointManager(str(root)) as mgr:
            for step, tree in zip(MIXED_STEPS, trees, strict=True):
                mgr.save(step, args=ocp.args.StandardSave(tree))
            mgr.wait_until_finished()
    finally:
        jax.config.update("jax_enable_x64", False)
    return [jax.tree.map(np.asarray, t) for t in trees]


def restore_raw(root: Path, step: int) -> Any:
    """A step restored by Orbax without a target, as saved (float64 kept: x64 on meanwhile),
    as numpy values."""
    jax.config.update("jax_enable_x64", True)
    try:
        with ocp.CheckpointManager(str(root)) as mgr:
            restored = mgr.restore(step, args=ocp.args.StandardRestore())
        return jax.tree.map(np.asarray, restored)
    finally:
        jax.config.update("jax_enable_x64", False)


def flat(tree: Any) -> dict[str, np.ndarray]:
    """Dotted leaf name -> numpy value."""
    out = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = ".".join(
            str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path
        )
        out[name] = np.asarray(value)
    assert out, "an empty tree"
    return out


def weighted(values: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """numpy's weighted mean of one leaf's values, in float64 (the reference)."""
    return np.average(np.stack([v.astype(np.float64) for v in values]), axis=0, weights=weights)


def ema(values: list[np.ndarray], decay: float) -> np.ndarray:
    """The exponential moving average of values in order, step by step in float64."""
    e = values[0].astype(np.float64)
    for v in values[1:]:
        e = decay * e + (1 - decay) * v.astype(np.float64)
    return e


def nnx_steps(root: Path) -> list[dict[str, np.ndarray]]:
    """Train the nnx MLP and save ``model`` + ``optimizer`` items at steps 1, 2, 3; each step's
    model state (dotted name -> value), in order."""
    from flax import nnx

    from tests.support.training_states import TX, DataIter, NnxMLP, nnx_step

    model = NnxMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, TX, wrt=nnx.Param)
    data = DataIter()
    saved = []
    with ocp.CheckpointManager(str(root)) as mgr:
        for step in LINEN_STEPS:
            nnx_step(model, optimizer, next(data))
            mgr.save(
                step,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(nnx.state(model)),
                    optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
                ),
            )
            saved.append(flat(nnx.state(model).to_pure_dict()))
        mgr.wait_until_finished()
    return saved
