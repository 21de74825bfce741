"""Training states saved the way users save them, by the installed Orbax and Flax, and the one
training step that resumes them.

- ``nnx_run``: a flax.nnx model beside its ``nnx.Optimizer``, saved as a Composite of two
  ``StandardSave`` items (``model``, ``optimizer``);
- ``linen_run``: a linen ``TrainState`` (item ``state``) beside a data iterator's state saved
  with ``JsonSave`` (item ``data_iter``); ``rng=True`` adds a dropout key to the TrainState;
- ``grain_run``: the same ``TrainState`` fed by a grain ``MapDataset`` iterator, saved as item
  ``state`` beside grain's own item ``data_iter`` (``grain.checkpoint.CheckpointSave``);
- ``cnn_run``: a CNN without dropout as one ``TrainState`` (no RNG to lose);
- ``save_params_only``: the parameters alone.

Each ``*_run`` trains a few steps, saves, and returns what an uninterrupted run continues with.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import nnx
from flax.training import train_state

SAVED_STEP = 3
TX = optax.adam(1e-2)


class DataIter:
    """A shuffled-epoch iterator over a small data set: its state is ``{'epoch', 'index'}``,
    what a trainer saves with ``JsonSave`` to continue the same data order."""

    def __init__(self, n: int = 24, batch: int = 4, image: bool = False) -> None:
        rng = np.random.default_rng(0)
        shape = (n, 6, 6, 1) if image else (n, 4)
        self.x = rng.standard_normal(shape).astype(np.float32)
        self.y = rng.standard_normal((n, 2)).astype(np.float32)
        self.batch, self.epoch, self.index = batch, 0, 0

    def __next__(self) -> tuple[jax.Array, jax.Array]:
        order = np.random.default_rng(self.epoch).permutation(len(self.x))
        take = order[self.index : self.index + self.batch]
        self.index += self.batch
        if self.index >= len(self.x):
            self.epoch, self.index = self.epoch + 1, 0
        return jnp.asarray(self.x[take]), jnp.asarray(self.y[take])

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def set_state(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


# flax.nnx ------------------------------------------------------------------------------------
class NnxMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(4, 8, rngs=rngs)
        self.linear2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear2(jax.nn.relu(self.linear1(x)))


def nnx_step(model: NnxMLP, optimizer: nnx.Optimizer, batch: tuple[Any, Any]) -> jax.Array:
    """One training step: the loss's gradient (jax.grad through nnx), Adam's update."""
    x, y = batch
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss


@dataclass
class NnxRun:
    model: NnxMLP
    optimizer: nnx.Optimizer
    data: DataIter


def nnx_run(root: Path) -> NnxRun:
    """Train ``SAVED_STEP`` steps and save them as ``model`` + ``optimizer`` items."""
    model = NnxMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, TX, wrt=nnx.Param)
    data = DataIter()
    for _ in range(SAVED_STEP):
        nnx_step(model, optimizer, next(data))
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(
            SAVED_STEP,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)),
                optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
            ),
        )
        mgr.wait_until_finished()
    return NnxRun(model, optimizer, data)


# linen ---------------------------------------------------------------------------------------
class LinenMLP(nn.Module):
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.relu(nn.Dense(8)(x))
        if self.dropout:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(2)(x)


class CNN(nn.Module):
    """A small CNN without dropout: nothing random after initialisation."""

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        return nn.Dense(2)(x.mean(axis=(1, 2)))


class RngTrainState(train_state.TrainState):  # type: ignore[misc]
    """A TrainState that carries its dropout key, as flax's examples do."""

    rng: jax.Array


def linen_state(model: nn.Module, sample: jax.Array, rng: bool = False) -> Any:
    params = model.init(jax.random.PRNGKey(0), sample)["params"]
    if rng:
        return RngTrainState.create(
            apply_fn=model.apply, params=params, tx=TX, rng=jax.random.PRNGKey(1)
        )
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=TX)


def linen_step(state: Any, batch: tuple[Any, Any]) -> tuple[Any, jax.Array]:
    """One training step: jax.grad of the loss, the optax update; a state with a dropout key
    splits it for this step's masks and keeps the rest."""
    x, y = batch
    rng = getattr(state, "rng", None)
    sub = None
    if rng is not None:
        rng, sub = jax.random.split(rng)

    def loss_fn(params: Any) -> jax.Array:
        rngs = {"dropout": sub} if sub is not None else None
        out = state.apply_fn({"params": params}, x, train=sub is not None, rngs=rngs)
        return jnp.mean((out - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    state = state.apply_gradients(grads=grads)
    return (state.replace(rng=rng) if rng is not None else state), loss


@dataclass
class LinenRun:
    state: Any
    data: Any  # a DataIter, or the grain iterator of `grain_run`


def linen_run(root: Path, rng: bool = False, data_iter: bool = True) -> LinenRun:
    """An MLP's TrainState (with a dropout key if ``rng``) trained ``SAVED_STEP`` steps, saved
    as item ``state`` beside the data iterator's JSON item ``data_iter``."""
    data = DataIter()
    state = linen_state(LinenMLP(dropout=0.5 if rng else 0.0), next(DataIter())[0], rng)
    for _ in range(SAVED_STEP):
        state, _ = linen_step(state, next(data))
    items: dict[str, Any] = {"state": ocp.args.StandardSave(state)}
    if data_iter:
        items["data_iter"] = ocp.args.JsonSave(data.get_state())
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(SAVED_STEP, args=ocp.args.Composite(**items))
        mgr.wait_until_finished()
    return LinenRun(state, data)


def grain_iterator() -> Any:
    """A fresh grain iterator over ``DataIter``'s data: a shuffled ``MapDataset`` in batches of 4
    (``(x, y)`` as numpy arrays), the way grain's docs build one."""
    import grain

    data = DataIter()
    ds = grain.MapDataset.range(len(data.x)).shuffle(seed=0).repeat(4)
    return iter(ds.map(lambda i: (data.x[i], data.y[i])).batch(4).to_iter_dataset())


def grain_run(root: Path) -> LinenRun:
    """The MLP's TrainState trained ``SAVED_STEP`` steps on ``grain_iterator()`` batches, saved as
    item ``state`` beside the iterator saved by grain's handler as item ``data_iter``; the run's
    ``data`` is the grain iterator, positioned at the next batch."""
    import grain

    data = grain_iterator()
    state = linen_state(LinenMLP(), next(DataIter())[0])
    for _ in range(SAVED_STEP):
        state, _ = linen_step(state, next(data))
    items = ocp.args.Composite(
        state=ocp.args.StandardSave(state), data_iter=grain.checkpoint.CheckpointSave(data)
    )
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(SAVED_STEP, args=items)
        mgr.wait_until_finished()
    return LinenRun(state, data)


def restore_grain_run(root: Path) -> tuple[Any, Any]:
    """Restore a ``grain_run`` step as its user does: the TrainState into its abstract state
    and a fresh grain iterator through ``grain.checkpoint.CheckpointRestore``."""
    import grain

    abstract = jax.eval_shape(lambda: linen_state(LinenMLP(), next(DataIter())[0]))
    with ocp.CheckpointManager(root) as mgr:
        restored = mgr.restore(
            mgr.latest_step(),
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract),
                data_iter=grain.checkpoint.CheckpointRestore(grain_iterator()),
            ),
        )
    return restored.state, restored.data_iter


def cnn_run(root: Path) -> LinenRun:
    """A CNN's TrainState (no dropout, no key) saved as a step's one item."""
    data = DataIter(image=True)
    state = linen_state(CNN(), next(DataIter(image=True))[0])
    for _ in range(SAVED_STEP):
        state, _ = linen_step(state, next(data))
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(SAVED_STEP, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return LinenRun(state, data)


def save_params_only(root: Path) -> None:
    """The parameters alone, as a user exporting weights saves them."""
    state = linen_state(LinenMLP(), next(DataIter())[0])
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(SAVED_STEP, args=ocp.args.StandardSave({"params": state.params}))
        mgr.wait_until_finished()
