"""A mixed-precision training state: bfloat16 ``params`` derived from a float32 master copy, an
EMA of the weights and Adam over the master copy, in a linen ``TrainState`` subclass.

``master_params`` and ``ema_params`` mirror ``params`` leaf for leaf: ``ckpt migrate`` carries
them through a rename or a widening written for ``params`` (see ``rename_and_widen_mixed.yaml``).

    python examples/mixed_precision.py --workdir demo_runs/mixed --steps 3
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import struct
from flax.training import train_state

IN_DIM, OUT_DIM = 8, 4


class MLP(nn.Module):
    hidden: int = 16
    name_hidden: str | None = None  # the widened model calls its first layer ``hidden``

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden, name=self.name_hidden)(x))
        return nn.Dense(OUT_DIM, name="Dense_1")(x)


class MixedState(train_state.TrainState):  # type: ignore[misc]
    master_params: Any = struct.field(pytree_node=True)
    ema_params: Any = struct.field(pytree_node=True)


def make_data(n: int = 32) -> tuple[jax.Array, jax.Array]:
    return jax.random.normal(jax.random.key(1), (n, IN_DIM)), jax.random.normal(
        jax.random.key(2), (n, OUT_DIM)
    )


def model_and_tx(hidden: int, renamed: bool) -> tuple[MLP, Any]:
    return MLP(hidden, "hidden" if renamed else None), optax.adam(1e-2)


def init_state(hidden: int = 16, renamed: bool = False, dtype: Any = jnp.bfloat16) -> Any:
    model, tx = model_and_tx(hidden, renamed)
    master = model.init(jax.random.key(0), jnp.zeros((1, IN_DIM)))["params"]
    state = MixedState.create(
        apply_fn=model.apply, params=master, tx=tx, master_params=master, ema_params=master
    )
    return state.replace(params=jax.tree_util.tree_map(lambda p: p.astype(dtype), master))


def abstract_wide() -> Any:
    """The state of the widened, renamed float16 model: a ``ckpt migrate --target``."""
    return jax.eval_shape(lambda: init_state(32, renamed=True, dtype=jnp.float16))


def make_train_step(hidden: int = 16, renamed: bool = False, dtype: Any = jnp.bfloat16) -> Any:
    """One step: gradients on the float32 master copy, Adam, the EMA, ``params`` re-derived."""
    model, tx = model_and_tx(hidden, renamed)

    def loss(master: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((model.apply({"params": master}, x) - y) ** 2)

    @jax.jit
    def step(state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(state.master_params, x, y)
        updates, opt_state = tx.update(grads, state.opt_state, state.master_params)
        master = optax.apply_updates(state.master_params, updates)
        ema = jax.tree_util.tree_map(lambda e, m: 0.9 * e + 0.1 * m, state.ema_params, master)
        params = jax.tree_util.tree_map(lambda p: p.astype(dtype), master)
        new = state.replace(
            step=state.step + 1, params=params, master_params=master, ema_params=ema
        )
        return new.replace(opt_state=opt_state), value

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    state, step = init_state(), make_train_step()
    x, y = make_data()
    for _ in range(args.steps):
        state, loss = step(state, x, y)
    with ocp.CheckpointManager(os.path.abspath(args.workdir)) as mgr:  # Orbax wants absolute paths
        mgr.save(args.steps, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    print(f"saved step {args.steps} to {args.workdir} (loss {float(loss):.4f})")


if __name__ == "__main__":
    main()
