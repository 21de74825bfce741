"""``ckpt migrate`` on a mixed-precision training state: the float32 master copy and the EMA of
the parameters follow a rename and a resize written for ``params``, a cast of ``params`` leaves
them float32, Orbax restores the result into the new model's state and training resumes."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.sharded import read_values

pytestmark = pytest.mark.slow

NARROW, WIDE = 16, 32
SPEC = r"""
    rules:
      - {op: rename, from: 'params\.Dense_0\.(.*)', to: 'params.hidden.\1'}
      - {op: resize, match: 'params\.hidden\.kernel', shape: [null, 32], init: 'normal(0.5)'}
      - {op: resize, match: 'params\.hidden\.bias', shape: [32], init: zeros}
      - {op: resize, match: 'params\.Dense_1\.kernel', shape: [32, null], init: zeros}
      - {op: cast, match: 'params\..*', dtype: float16}
"""


def mixed_precision(width: int, renamed: bool, dtype: Any) -> tuple[Any, Any, Any]:
    """A linen TrainState subclass holding ``dtype`` params derived from a float32 master copy,
    an EMA of the master copy and Adam over the master copy; its init and one training step."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from flax import struct
    from flax.training import train_state

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.relu(nn.Dense(width, name="hidden" if renamed else None)(x))
            return nn.Dense(4, name="Dense_1")(x)

    class MixedState(train_state.TrainState):  # type: ignore[misc]
        master_params: Any = struct.field(pytree_node=True)
        ema_params: Any = struct.field(pytree_node=True)

    model, tx = MLP(), optax.adam(1e-2)

    def init() -> Any:
        master = model.init(jax.random.key(0), jnp.zeros((1, 8)))["params"]
        state = MixedState.create(
            apply_fn=model.apply, params=master, tx=tx, master_params=master, ema_params=master
        )
        return state.replace(params=jax.tree_util.tree_map(lambda p: p.astype(dtype), master))

    def loss(master: Any, x: Any, y: Any) -> Any:
        return jnp.mean((model.apply({"params": master}, x) - y) ** 2)

    @jax.jit
    def step(state: Any, x: Any, y: Any) -> tuple[Any, Any]:
        value, grads = jax.value_and_grad(loss)(state.master_params, x, y)
        updates, opt_state = tx.update(grads, state.opt_state, state.master_params)
        master = optax.apply_updates(state.master_params, updates)
        ema = jax.tree_util.tree_map(lambda e, m: 0.9 * e + 0.1 * m, state.ema_params, master)
        params = jax.tree_util.tree_map(lambda p: p.astype(dtype), master)
        return state.replace(
            step=state.step + 1,
            params=params,
            master_params=master,
            ema_params=ema,
            opt_state=opt_state,
        ), value

    return init, step, loss


def test_master_and_ema_follow_params_restore_and_train(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import orbax.checkpoint as ocp

    x = jax.random.normal(jax.random.key(1), (32, 8))
    y = jax.random.normal(jax.random.key(2), (32, 4))
    init, narrow_step, _ = mixed_precision(NARROW, renamed=False, dtype=jnp.bfloat16)
    state = init()
    for _ in range(3):
        state, _ = narrow_step(state, x, y)
    src, dst = tmp_path / "src", tmp_path / "dst"
    with ocp.CheckpointManager(str(src)) as mgr:
        mgr.save(3, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(SPEC))

    plan = cli("migrate", src, dst, "--spec", spec, "--dry-run", "--json")
    assert plan.code == 0, plan.stderr
    ops = {leaf["name"]: leaf["operations"] for leaf in plan.json()["leaves"]}
    followed = [("rename", "params.Dense_0.kernel"), ("resize", "params.hidden.kernel")]
    for follower in ("master_params", "ema_params", "opt_state.0.mu", "opt_state.0.nu"):
        steps = ops[f"{follower}.hidden.kernel"]
        assert [(s["op"], s["follows"]) for s in steps] == followed
    assert [s["op"] for s in ops["params.hidden.kernel"]] == ["rename", "resize", "cast"]
    text = cli("migrate", src, dst, "--spec", spec, "--dry-run")
    assert "master_params.hidden.kernel" in text.stdout
    assert "(follows params.Dense_0.kernel)" in text.stdout

    r = cli("migrate", src, dst, "--spec", spec)
    assert r.code == 0, r.stderr
    before, after = read_values(src), read_values(dst)
    assert after["params.hidden.kernel"].dtype == np.float16  # the cast reached params only
    for tree in ("master_params", "ema_params"):
        old, new = before[f"{tree}.Dense_0.kernel"], after[f"{tree}.hidden.kernel"]
        assert new.dtype == np.float32 and new.shape == (8, WIDE)
        assert new[:, :NARROW].tobytes() == old.tobytes()  # float32 bits kept
        assert f"{tree}.Dense_0.kernel" not in after
        assert np.all(after[f"{tree}.Dense_1.kernel"][NARROW:] == 0)
    master, ema = after["master_params.hidden.kernel"], after["ema_params.hidden.kernel"]
    # Widened units: the master and EMA copies hold the values the parameters got.
    assert np.abs(master[:, NARROW:]).max() > 0
    np.testing.assert_array_equal(ema[:, NARROW:], master[:, NARROW:])
    # The parameters drew them as bfloat16 (the resize precedes the cast to float16).
    drawn = master[:, NARROW:].astype(ml_dtypes.bfloat16).astype(np.float16)
    np.testing.assert_array_equal(after["params.hidden.kernel"][:, NARROW:], drawn)
    assert np.all(after["opt_state.0.mu.hidden.kernel"][:, NARROW:] == 0)  # moments: zeros

    wide_init, wide_step, loss = mixed_precision(WIDE, renamed=True, dtype=jnp.float16)
    abstract = jax.eval_shape(wide_init)
    with ocp.CheckpointManager(str(dst)) as mgr:
        restored = mgr.restore(3, args=ocp.args.StandardRestore(abstract))
    assert restored.master_params["hidden"]["kernel"].dtype == jnp.float32
    assert restored.params["hidden"]["kernel"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(restored.ema_params["hidden"]["kernel"]), ema)
    assert int(restored.step) == 3 and int(restored.opt_state[0].count) == 3

    _, narrow_loss = narrow_step(state, x, y)
    trained, wide_loss = wide_step(restored, x, y)
    assert np.isfinite(float(wide_loss)) and int(trained.step) == 4
    # New hidden units feed zero output weights: the wide model computes what the narrow one did.
    assert float(wide_loss) == pytest.approx(float(narrow_loss), rel=1e-5)
    assert float(loss(trained.master_params, x, y)) < float(wide_loss)
