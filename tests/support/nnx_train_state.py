"""An nnx model and ``nnx.Optimizer`` (``clip_by_global_norm`` + ``inject_hyperparams(adamw)``),
saved as ``{"model": nnx.state(model), "optimizer": nnx.state(optimizer)}``: nnx turns optax's tuples into mappings with integer keys and
keeps no empty state.

``abstract_state`` is a ``--target MODULE:FUNCTION``; ``train_step`` is one real step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.l1 = nnx.Linear(5, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.l2 = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.l2(nnx.relu(self.bn(self.l1(x))))


def make() -> tuple[Model, nnx.Optimizer]:
    model = Model(nnx.Rngs(0))
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-4),
    )
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def state_of(model: Model, optimizer: nnx.Optimizer) -> dict[str, Any]:
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def abstract_state() -> Any:
    return jax.eval_shape(lambda: state_of(*make()))


def train_step(model: Model, optimizer: nnx.Optimizer, seed: int) -> Any:
    """One step on batch ``seed`` (the model and optimizer change in place): the loss."""
    x = jax.random.normal(jax.random.key(seed), (16, 5))
    y = jnp.sin(x[:, :3])

    def loss_fn(model: Model) -> Any:
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss
