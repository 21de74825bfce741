"""Save a Flax NNX model and its optimizer as two items of one step, as the NNX checkpointing
guide does: ``Composite(model=StandardSave(nnx.state(model)),
optimizer=StandardSave(nnx.state(optimizer)))``, after one step of Adam (moments not zero).

``make demo`` reshards and migrates this step whole: both items in one new step, Adam's moments
in the optimizer item following the model item's parameters.

    python examples/nnx_model_optimizer.py --workdir runs/nnx
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(8, 16, rngs=rngs)
        self.out = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        return self.out(nnx.relu(self.linear(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    rs = np.random.RandomState(1)
    x, y = rs.normal(size=(16, 8)), rs.normal(size=(16, 4))
    grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    with ocp.CheckpointManager(args.workdir.absolute()) as mgr:
        mgr.save(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)),
                optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
            ),
        )
        mgr.wait_until_finished()
    print(f"saved step 1 (items model, optimizer) to {args.workdir}")


if __name__ == "__main__":
    main()
