"""``flatten_abstract``: an abstract state's leaves named as Orbax names them, with the switches
the doctor uses (typed keys kept, empty nodes collected)."""

from __future__ import annotations

from ckpt_cli.core.spec.target import flatten_abstract


def _state() -> object:
    import jax
    import jax.numpy as jnp
    import optax

    params = {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32)}
    opt = jax.eval_shape(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)).init, params)
    return {"params": params, "opt": opt, "rng": jax.eval_shape(lambda: jax.random.key(0))}


def test_a_typed_key_is_its_raw_data_unless_kept_and_empty_nodes_are_not_leaves() -> None:
    plain = flatten_abstract(_state())
    assert plain["rng"] == ((2,), "uint32")
    assert plain["params.w"] == ((4, 2), "float32") and "opt.0" not in plain
    empty: set[str] = set()
    doctor = flatten_abstract(_state(), typed_keys=True, empty=empty)
    assert doctor["rng"] == ((), "key<fry>")
    assert empty == {"opt.0", "opt.1.1"}  # clip's and adam's optax.EmptyState
    assert set(doctor) == set(plain)
