"""A linen ``TrainState`` as people train one: BatchNorm statistics, an optax chain of
``clip_by_global_norm`` and ``inject_hyperparams(adamw)`` (tuples, NamedTuples, ``EmptyState``,
an empty dict of hyperparameter states), and a Python-int ``step`` (Orbax saves it as a scalar).

``abstract_state`` is a ``--target MODULE:FUNCTION`` (``tests.support.linen_train_state:abstract_state``);
``train_step`` is one real step (``jax.grad`` of a loss, ``apply_gradients``), not jitted so the
step stays the Python int Orbax saves as ``scalar``.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state


class Model(nn.Module):
    @nn.compact
    def __call__(self, x: Any, train: bool = True) -> Any:
        x = nn.Dense(8)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        return nn.Dense(3)(nn.relu(x))


class TrainState(train_state.TrainState):  # type: ignore[misc]
    batch_stats: Any


def make_state() -> TrainState:
    model = Model()
    variables = model.init(jax.random.key(0), jnp.ones((4, 5)), train=False)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-4),
    )
    return TrainState.create(
        apply_fn=model.apply,
        params=variables["params"],
        tx=tx,
        batch_stats=variables["batch_stats"],
    )


def abstract_state() -> Any:
    return jax.eval_shape(make_state)


def batch(seed: int) -> tuple[Any, Any]:
    key = jax.random.key(seed)
    x = jax.random.normal(key, (16, 5))
    return x, jnp.sin(x[:, :3])


def train_step(state: TrainState, seed: int) -> tuple[TrainState, Any]:
    """One step on batch ``seed``: the new state and the loss before it."""
    x, y = batch(seed)

    def loss_fn(params: Any) -> Any:
        out, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, x, mutable=["batch_stats"]
        )
        return jnp.mean((out - y) ** 2), updates

    (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    new = state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])
    return new, loss


def mixed_tree() -> dict[str, Any]:
    """Every kind of node Orbax records: lists and tuples, empty ones, None, a host array and a
    Python float beside jax arrays of several dtypes."""
    import numpy as np

    return {
        "layers": [{"w": jnp.arange(6.0).reshape(2, 3)}, {"w": jnp.ones((2, 3), jnp.bfloat16)}],
        "pair": (jnp.array([1, 2], jnp.int8), jnp.array([True, False])),
        "empty": {"list": [], "tuple": (), "dict": {}, "none": None},
        "host": np.arange(4, dtype=np.uint16),
        "scale": 0.5,
    }


def abstract_mixed() -> Any:
    return jax.eval_shape(mixed_tree)


def save_trained(root: Any) -> TrainState:
    """One step trained (batch 1) and saved as step 1 of a ``CheckpointManager`` root at
    ``root``, as a training loop saves it; the state saved."""
    import orbax.checkpoint as ocp

    state, _ = train_step(make_state(), seed=1)
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return state


def assert_resumes(root: Any, saved: TrainState) -> None:
    """Step 1 of ``root`` restores into ``abstract_state`` and trains one step (batch 2) to
    the loss and parameters of the uninterrupted run from ``saved``."""
    import numpy as np
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(root)) as mgr:
        restored = mgr.restore(1, args=ocp.args.StandardRestore(abstract_state()))
    resumed, loss = train_step(restored, seed=2)
    expected, expected_loss = train_step(saved, seed=2)
    assert int(resumed.step) == 2 and np.isfinite(float(loss))
    assert float(loss) == float(expected_loss)
    got, want = (
        jax.tree_util.tree_leaves(resumed.params),
        jax.tree_util.tree_leaves(expected.params),
    )
    assert got and len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
