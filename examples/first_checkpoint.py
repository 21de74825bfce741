"""Save three steps of a small training state with Orbax, into runs/first: ckpt's tutorial run.

The state has the four parts a resumable run needs: params, opt_state (Adam), step and rng.
docs/tutorials/first-checkpoint.md shows this file and the README's quick start runs it.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp

k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
params = {
    "Dense_0": {"kernel": jax.random.normal(k1, (4, 32)), "bias": jnp.zeros(32)},
    "Dense_1": {"kernel": jax.random.normal(k2, (32, 1)), "bias": jnp.zeros(1)},
}
tx = optax.adam(1e-3)
state = {
    "params": params,
    "opt_state": tx.init(params),
    "step": jnp.asarray(0, jnp.int32),
    "rng": jax.random.key_data(k3),
}

mgr = ocp.CheckpointManager(Path("runs/first").absolute())
for step in (100, 200, 300):
    # A stand-in for training: one Adam update with made-up gradients moves every parameter.
    grads = jax.tree.map(jnp.ones_like, state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    state = {
        "params": optax.apply_updates(state["params"], updates),
        "opt_state": opt_state,
        "step": jnp.asarray(step, jnp.int32),
        "rng": state["rng"],
    }
    mgr.save(step, args=ocp.args.StandardSave(state))
mgr.wait_until_finished()
mgr.close()
print(f"saved steps {mgr.all_steps()} in runs/first")
