"""The seed's training loop with today's Orbax API: a Flax MLP whose full training state is saved.

The saved state is the four parts a resumable run needs: ``params``, ``opt_state`` (Adam),
``step`` and ``rng`` (the key data, so dropout/shuffling continue where they stopped).
A ``CheckpointManager`` saves every ``--save-every`` steps and keeps the last ``--keep``; a
second run with a larger ``--steps`` resumes from the latest step instead of starting over.

    python examples/train_mlp.py --workdir demo_runs/exp7 --steps 300
    python examples/train_mlp.py --workdir demo_runs/exp7 --steps 600   # resumes at 300
    python examples/train_mlp.py --workdir demo_runs/rec --digests      # ld1 digests at save time

``--digests`` wraps the manager in ``ckpt_cli.orbax.DigestingCheckpointManager``: each saved
step gets its digest record while Orbax writes it, so ``ckpt verify --deep`` checks the values
against what the trainer held, with no ``verify --record`` pass.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

IN_DIM, OUT_DIM = 16, 10


class MLP(nn.Module):
    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(OUT_DIM)(x)


def make_data(n: int = 512) -> tuple[jax.Array, jax.Array]:
    rs = np.random.RandomState(0)
    x = rs.normal(size=(n, IN_DIM)).astype(np.float32)
    w = rs.normal(size=(IN_DIM, OUT_DIM)).astype(np.float32)
    y = np.argmax(x @ w, axis=-1)
    return jnp.asarray(x), jnp.asarray(y)


def init_state(hidden: int, seed: int = 0) -> dict[str, Any]:
    key = jax.random.key(seed)
    key, init_key = jax.random.split(key)
    params = MLP(hidden).init(init_key, jnp.zeros((1, IN_DIM)))["params"]
    tx = optax.adam(1e-3)
    return {
        "params": params,
        "opt_state": tx.init(params),
        "step": jnp.asarray(0, jnp.int32),
        "rng": jax.random.key_data(key),
    }


def abstract_state(hidden: int = 128) -> Any:
    """The shapes and dtypes of a fresh state of width ``hidden``: a ``ckpt migrate --target``."""
    return jax.eval_shape(lambda: init_state(hidden))


def make_train_step(hidden: int):  # type: ignore[no-untyped-def]
    model, tx = MLP(hidden), optax.adam(1e-3)

    @jax.jit
    def train_step(
        state: dict[str, Any], x: jax.Array, y: jax.Array
    ) -> tuple[dict[str, Any], jax.Array]:
        key = jax.random.wrap_key_data(state["rng"])
        key, batch_key = jax.random.split(key)
        idx = jax.random.choice(batch_key, x.shape[0], (64,), replace=False)

        def loss_fn(params: Any) -> jax.Array:
            logits = model.apply({"params": params}, x[idx])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y[idx]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
            "step": state["step"] + 1,
            "rng": jax.random.key_data(key),
        }, loss

    return train_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--digests", action="store_true", help="record ld1 digests at save time")
    args = ap.parse_args()

    mgr = ocp.CheckpointManager(
        os.path.abspath(args.workdir),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=args.keep, save_interval_steps=args.save_every
        ),
    )
    if args.digests:
        from ckpt_cli.orbax import DigestingCheckpointManager

        mgr = DigestingCheckpointManager(mgr)
    state = init_state(args.hidden)
    latest = mgr.latest_step()
    if latest is not None:
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        state = mgr.restore(latest, args=ocp.args.StandardRestore(abstract))
        print(f"resumed from step {latest} (saved state step={int(state['step'])})")
    else:
        print("no checkpoint found: starting from step 0")
    x, y = make_data()
    train_step = make_train_step(args.hidden)
    loss = jnp.nan
    for step in range(int(state["step"]) + 1, args.steps + 1):
        state, loss = train_step(state, x, y)
        mgr.save(step, args=ocp.args.StandardSave(state))
    mgr.wait_until_finished()
    print(f"trained to step {args.steps}, loss {float(loss):.4f}; kept steps {mgr.all_steps()}")
    mgr.close()


if __name__ == "__main__":
    main()
