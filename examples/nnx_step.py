"""Save a flax.nnx training step the way the Flax guides do: the model and its optimizer as two
items of one step, beside the grain data iterator that feeds it, saved by grain's own handler
(``grain.checkpoint.CheckpointSave``; ``make demo`` inspects it). Needs ``pip install grain``.

    python examples/nnx_step.py demo_runs/nnx

``ckpt inspect demo_runs/nnx --item model`` then shows the model's tree and the training state
of the step: parameters in ``model``, optimizer state and step in ``optimizer``, the data order
in ``data_iter`` (grain's iterator state); no RNG key (the MLP has no dropout) is a note, not a failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(4, 16, rngs=rngs)
        self.linear2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear2(jax.nn.relu(self.linear1(x)))


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "demo_runs/nnx").absolute()
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = np.asarray(jax.random.normal(jax.random.key(1), (32, 4)))
    y = x.sum(axis=1, keepdims=True)
    dataset = grain.MapDataset.range(len(x)).shuffle(seed=0).repeat(None)
    data = iter(dataset.map(lambda i: (x[i], y[i])).batch(8).to_iter_dataset())
    steps = 3
    for _ in range(steps):
        xb, yb = next(data)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(xb) - yb) ** 2))(model)  # noqa: B023
        optimizer.update(model, grads)
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(
            steps,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)),
                optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
                data_iter=grain.checkpoint.CheckpointSave(data),
            ),
        )
        mgr.wait_until_finished()
    print(
        f"saved step {steps} (loss {float(loss):.4f}) in {root}: items model, optimizer, data_iter"
    )


if __name__ == "__main__":
    main()
