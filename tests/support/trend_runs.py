"""``trend_runs``: two real training runs for ``ckpt trend``, trained once per session (per xdist
worker): a linen MLP with optax, saved by a ``CheckpointManager`` at every step with its loss (``metrics=``, kept with a
``best_fn`` as Orbax requires).

Both runs freeze ``Dense_1`` (``optax.multi_transform`` with ``set_to_zero``), and keep ``gate``
at zero (the loss multiplies it by zero: its gradient, Adam moments and updates are all zero).
Both kill unit ``DEAD_UNIT`` of ``DEAD_LEAF`` at step ``DEAD_STEP``: a mask multiplied into
the parameters after each update from then on keeps its column of the kernel at zero.
The diverged run then puts a NaN into ``params.Dense_0.kernel`` before saving step ``NAN_STEP``
(and the steps after it, training on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

STEPS = 6
NAN_STEP = 5
#: The leaves the findings must name (names as ckpt writes them).
FROZEN = ("params.Dense_1.bias", "params.Dense_1.kernel")
NAN_LEAF = "params.Dense_0.kernel"
DEAD_LEAF = "params.Dense_0.kernel"
DEAD_UNIT = 7
DEAD_STEP = 3


#: ``wide_run``: its steps, and the leaf sharded over 8 devices in chunks of 256 rows (4 MiB a
#: step: several blocks, so a scaled-out trend cuts it into units), NaN at ``WIDE_NAN_STEP``.
WIDE_STEPS = (10, 20, 30)
WIDE_LEAF = "params.embed"
WIDE_SHAPE = (2048, 512)
WIDE_NAN_STEP = 30


@dataclass(frozen=True)
class TrendRuns:
    healthy: Path
    diverged: Path
    losses: dict[int, float]  # the healthy run's loss at each step


def train(root: Path, nan_at: int | None) -> dict[int, float]:
    """Train ``STEPS`` steps into ``root``; a NaN in ``NAN_LEAF`` from step ``nan_at`` on."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import orbax.checkpoint as ocp

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            gate = self.param("gate", nn.initializers.zeros, (4,))
            h = nn.relu(nn.Dense(16, name="Dense_0")(x))
            return nn.Dense(3, name="Dense_1")(h) + 0.0 * gate.sum()

    model = Model()
    x = jax.random.normal(jax.random.key(1), (32, 8))
    y = jax.random.normal(jax.random.key(2), (32, 3))
    params = model.init(jax.random.key(0), x)["params"]
    labels = {"Dense_0": "train", "Dense_1": "freeze", "gate": "train"}
    tx = optax.multi_transform(
        {"train": optax.adam(1e-2), "freeze": optax.set_to_zero()},
        lambda p: {k: jax.tree.map(lambda _, k=k: labels[k], v) for k, v in p.items()},
    )
    opt_state = tx.init(params)

    def loss_fn(p: Any) -> Any:
        return jnp.mean((model.apply({"params": p}, x) - y) ** 2)

    losses: dict[int, float] = {}
    # A best_fn: Orbax writes the metrics passed to save (the ``metrics`` item) only then.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None, save_interval_steps=1, best_fn=lambda m: m["loss"], best_mode="min"
    )
    with ocp.CheckpointManager(root.absolute(), options=options) as mngr:
        for step in range(1, STEPS + 1):
            loss, grads = jax.value_and_grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            if step >= DEAD_STEP:
                mask = np.ones(params["Dense_0"]["kernel"].shape, np.float32)
                mask[:, DEAD_UNIT] = 0
                kernel = params["Dense_0"]["kernel"] * mask
                params = {**params, "Dense_0": {**params["Dense_0"], "kernel": kernel}}
            if nan_at is not None and step == nan_at:
                kernel = np.array(params["Dense_0"]["kernel"])
                kernel[0, 0] = math.nan
                params = {**params, "Dense_0": {**params["Dense_0"], "kernel": kernel}}
            losses[step] = float(loss)
            state = {"params": params, "opt_state": opt_state, "step": step}
            mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": float(loss)})
        mngr.wait_until_finished()
    return losses


@pytest.fixture(scope="session")
def trend_runs(tmp_path_factory: pytest.TempPathFactory) -> TrendRuns:
    base = tmp_path_factory.mktemp("trend")
    losses = train(base / "healthy", None)
    train(base / "diverged", NAN_STEP)
    return TrendRuns(base / "healthy", base / "diverged", losses)


def save_wide(root: Path) -> None:
    """``WIDE_STEPS`` of a CheckpointManager: ``WIDE_LEAF`` sharded by rows over 8 devices,
    moving each step (a NaN at ``WIDE_NAN_STEP``), a replicated kernel that never moves, and
    the step counter."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rs = np.random.RandomState(0)
    embed = rs.normal(size=WIDE_SHAPE).astype(np.float32)
    kernel = rs.normal(size=(64, 32)).astype(np.float32)
    with ocp.CheckpointManager(root.absolute()) as mngr:
        for step in WIDE_STEPS:
            embed = embed + 0.01 * rs.normal(size=WIDE_SHAPE).astype(np.float32)
            values = embed.copy()
            if step == WIDE_NAN_STEP:
                values[3, 7] = math.nan
            tree = {
                "params": {
                    "embed": jax.device_put(jnp.asarray(values), NamedSharding(mesh, P("data"))),
                    "kernel": jax.device_put(jnp.asarray(kernel), NamedSharding(mesh, P())),
                },
                "step": jnp.asarray(step, jnp.int32),
            }
            mngr.save(step, args=ocp.args.StandardSave(tree))
        mngr.wait_until_finished()


@pytest.fixture(scope="session")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trend-wide") / "run"
    save_wide(root)
    return root
