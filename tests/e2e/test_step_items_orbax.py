"""``reshard``, ``migrate`` and ``diff`` act on every item of a step: a Flax NNX ``model`` +
``optimizer`` Composite save (the NNX checkpointing guide's layout), proven by real Orbax
restores of both items on 8 forced CPU devices and one training step resumed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

RULES = ("--rule", "linear.kernel.*=[null, model]", "--rule", "out.kernel.*=[model, null]")
#: Widen the first layer 16 -> 24 and rename it `hidden` (the spec `make demo` shows).
SPEC = REPO / "examples" / "nnx_widen_16_to_24.yaml"


def _model(width: int, first: str = "linear", seed: int = 0) -> Any:
    """An MLP 8 -> width -> 4 whose first layer is the attribute ``first``."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            setattr(self, first, nnx.Linear(8, width, rngs=rngs))
            self.out = nnx.Linear(width, 4, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.out(nnx.relu(getattr(self, first)(x)))

    return MLP(nnx.Rngs(seed))


def _optimizer(model: Any) -> Any:
    import optax
    from flax import nnx

    return nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def _batch() -> tuple[Any, Any]:
    rs = np.random.RandomState(1)
    return rs.normal(size=(16, 8)).astype(np.float32), rs.normal(size=(16, 4)).astype(np.float32)


def _train_step(model: Any, optimizer: Any) -> float:
    """One step of Adam on a squared loss (jax.grad through nnx): the loss before it."""
    import jax.numpy as jnp
    from flax import nnx

    x, y = _batch()

    def loss_fn(m: Any) -> Any:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return float(loss)


def _save_trained(root: Path) -> tuple[Any, Any]:
    """Step 1 (after one training step, so Adam's moments are not zero) saved as the NNX guide
    does: Composite(model=..., optimizer=...). Returns the live model and optimizer."""
    import orbax.checkpoint as ocp
    from flax import nnx

    model = _model(16)
    optimizer = _optimizer(model)
    _train_step(model, optimizer)
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)),
                optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
            ),
        )
        mgr.wait_until_finished()
    return model, optimizer


def _name(path: Any) -> str:
    return ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _abstract(state: Any, specs: dict[str, Any] | None = None) -> Any:
    """``state`` (of nnx.eval_shape) as restore targets, with the target NamedSharding of
    each leaf named in ``specs`` (leaf name -> partition spec list; others replicated)."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if specs is None:
        return state
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def one(path: Any, x: Any) -> Any:
        spec = specs.get(_name(path)) or []
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P(*spec)))

    return jax.tree_util.tree_map_with_path(one, state)


def _restore(root: Path, width: int, first: str, specs: dict[str, Any] | None) -> Any:
    """Both items restored with CheckpointManager + Composite(StandardRestore) into the
    abstract state of a new model and optimizer, put into them; returns (model, optimizer)."""
    import orbax.checkpoint as ocp
    from flax import nnx

    model = _model(width, first, seed=7)  # other values: the restore must overwrite them
    optimizer = _optimizer(model)
    abstract_model = nnx.eval_shape(lambda: _model(width, first))
    abstract_opt = nnx.eval_shape(lambda: _optimizer(_model(width, first)))
    with ocp.CheckpointManager(str(root)) as mgr:
        got = mgr.restore(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(_abstract(nnx.state(abstract_model), specs)),
                optimizer=ocp.args.StandardRestore(_abstract(nnx.state(abstract_opt), specs)),
            ),
        )
    nnx.update(model, got["model"])
    nnx.update(optimizer, got["optimizer"])
    return model, optimizer


def _leaves(state: Any) -> dict[str, Any]:
    import jax

    return {_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}


def test_reshard_writes_both_items_and_training_resumes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from flax import nnx

    src, dst = tmp_path / "src", tmp_path / "dst"
    model, optimizer = _save_trained(src)
    r = cli("reshard", src, dst, "--mesh", "data=2,model=4", *RULES, "--json")
    assert r.code == 0, r.stderr
    out = r.json()
    assert out["schema_version"] == 5
    assert out["written_items"] == ["model", "optimizer"]
    assert [i["item"] for i in out["items"]] == ["model", "optimizer"]
    moments = {x["name"]: x for x in out["items"][1]["leaves"]}
    # Adam's moments in the optimizer item take the sharding of the model item's parameter.
    assert moments["opt_state.0.mu.linear.kernel.value"]["follows"] == "model/linear.kernel.value"
    assert moments["opt_state.0.nu.out.kernel.value"]["partition_spec"] == ["model", None]
    # The leaves of both items (their names differ): each one's target spec.
    specs = {x["name"]: x["partition_spec"] for x in out["leaves"] if x["partition_spec"]}

    restored, restored_opt = _restore(dst, 16, "linear", specs)
    assert tuple(restored.linear.kernel[...].sharding.spec) == (None, "model")
    mu = restored_opt.opt_state[0].mu["linear"]["kernel"][...]
    assert tuple(mu.sharding.spec) == (None, "model")
    before, after = _leaves(nnx.state(optimizer)), _leaves(nnx.state(restored_opt))
    assert before and before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(np.asarray(before[name]), np.asarray(after[name]), name)
    for name, value in _leaves(nnx.state(model)).items():
        np.testing.assert_array_equal(
            np.asarray(value), np.asarray(_leaves(nnx.state(restored))[name])
        )

    expected = _train_step(model, optimizer)  # the uninterrupted run's next step
    loss = _train_step(restored, restored_opt)
    assert int(restored_opt.step[...]) == 2
    assert math.isfinite(loss) and loss == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(
        np.asarray(restored.linear.kernel[...]), np.asarray(model.linear.kernel[...]), rtol=1e-5
    )


def test_migrate_renames_and_resizes_moments_in_the_optimizer_item(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst = tmp_path / "src", tmp_path / "dst"
    model, optimizer = _save_trained(src)
    r = cli("migrate", src, dst, "--spec", SPEC, "--json")
    assert r.code == 0, r.stderr
    out = r.json()
    assert out["schema_version"] == 5 and out["written_items"] == ["model", "optimizer"]
    opt_leaves = {x["name"]: x for x in out["items"][1]["leaves"]}
    assert opt_leaves["opt_state.0.mu.hidden.kernel.value"]["shape"] == [8, 24]
    assert opt_leaves["opt_state.0.nu.out.kernel.value"]["shape"] == [24, 4]
    assert "opt_state.0.mu.linear.kernel.value" not in opt_leaves

    restored, restored_opt = _restore(dst, 24, "hidden", None)
    old = np.asarray(model.linear.kernel[...])
    new = np.asarray(restored.hidden.kernel[...])
    np.testing.assert_array_equal(new[:, :16], old)
    for moment in ("mu", "nu"):
        got = np.asarray(getattr(restored_opt.opt_state[0], moment)["hidden"]["kernel"][...])
        was = np.asarray(getattr(optimizer.opt_state[0], moment)["linear"]["kernel"][...])
        assert np.any(was != 0)
        np.testing.assert_array_equal(got[:, :16], was)
        assert not got[:, 16:].any()  # a fresh Adam state for the new units
        out_kernel = getattr(restored_opt.opt_state[0], moment)["out"]["kernel"][...]
        assert out_kernel.shape == (24, 4) and not np.asarray(out_kernel)[16:].any()

    loss = _train_step(restored, restored_opt)
    assert int(restored_opt.step[...]) == 2
    assert math.isfinite(loss)


def test_diff_compares_item_by_item(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp
    from flax import nnx

    src, dst, lone = tmp_path / "src", tmp_path / "dst", tmp_path / "lone"
    model, _ = _save_trained(src)
    assert cli("reshard", src, dst, "--mesh", "data=2,model=4", *RULES).code == 0

    same = cli("diff", src, src, "--json")
    assert same.code == 0, same.stderr
    doc = same.json()
    assert doc["schema_version"] == 5 and doc["equal"]
    assert [i["item"] for i in doc["items"]] == ["model", "optimizer"]
    assert all(i["leaves"] for i in doc["items"])

    layout = cli("diff", src, dst, "--structure", "--json")
    assert layout.code == 1
    items = {i["item"]: i for i in layout.json()["items"]}
    assert items.keys() == {"model", "optimizer"}
    for name, status in (
        ("model", "linear.kernel.value"),
        ("optimizer", "opt_state.0.mu.linear.kernel.value"),
    ):
        leaves = {x["name"]: x["status"] for x in items[name]["leaves"]}
        assert leaves[status] == "sharding_changed", name
    text = cli("diff", src, dst, "--structure")
    assert "item optimizer: different" in text.stdout
    assert cli("diff", src, dst).code == 0  # values: equal, whatever the layout

    with ocp.CheckpointManager(str(lone)) as mgr:
        mgr.save(1, args=ocp.args.Composite(model=ocp.args.StandardSave(nnx.state(model))))
        mgr.wait_until_finished()
    one_sided = cli("diff", src, lone, "--json")
    assert one_sided.code == 1
    doc = one_sided.json()
    assert doc["items_only_a"] == ["optimizer"] and doc["items_only_b"] == []
    assert [i["item"] for i in doc["items"]] == ["model"] and doc["items"][0]["equal"]
    assert "item optimizer: only in A" in cli("diff", src, lone).stdout


def test_each_item_gets_its_digest_record_and_item_restricts(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst, one = tmp_path / "src", tmp_path / "dst", tmp_path / "one"
    _save_trained(src)
    assert cli("verify", src, "--record").code == 0
    assert cli("reshard", src, dst, "--mesh", "data=2,model=4", *RULES).code == 0
    step = dst / "1"
    assert (step / "model" / "_CKPT_DIGESTS.json").is_file()
    assert (step / "optimizer" / "_CKPT_DIGESTS.json").is_file()
    deep = cli("verify", dst, "--deep", "--json")
    assert deep.code == 0, deep.stdout
    # Both new items are checked against the values recorded on the source's layout.
    assert deep.json()["checked"]["digests"] == {"1/model": "checked", "1/optimizer": "checked"}

    r = cli("reshard", src, one, "--mesh", "data=2,model=4", *RULES, "--item", "model", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["written_items"] == ["model"]
    assert [i["item"] for i in r.json()["items"]] == ["model"]
    # The optimizer item is copied as it was: the same values, the source's layout.
    assert cli("diff", src, one, "--structure", "--item", "optimizer").code == 0


def test_an_added_leaf_needs_an_item(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, spec = tmp_path / "src", tmp_path / "add.yaml"
    _save_trained(src)
    spec.write_text("rules:\n  - {op: add, name: extra.scale, shape: [4], dtype: float32}\n")
    r = cli("migrate", src, tmp_path / "dst", "--spec", spec)
    assert r.code == 2
    assert "adds 'extra.scale' to a step of several items" in r.stderr
    assert "--item" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "dst").exists()
    target = cli("migrate", src, tmp_path / "dst", "--spec", SPEC, "--target", "x.y:z")
    assert target.code == 2
    assert "--target compares one item" in target.stderr and "--item" in target.stderr


def test_migrate_stacks_moments_in_the_optimizer_item(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp
    from flax import nnx

    from tests.support.sharded import read_values

    class Two(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.l0 = nnx.Linear(8, 8, rngs=rngs)
            self.l1 = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.l1(self.l0(x))

    model = Two(nnx.Rngs(0))
    optimizer = _optimizer(model)
    _train_step_on(model, optimizer)
    src, dst, spec = tmp_path / "src", tmp_path / "dst", tmp_path / "scan.yaml"
    with ocp.CheckpointManager(str(src)) as mgr:
        mgr.save(
            1,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)),
                optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
            ),
        )
        mgr.wait_until_finished()
    spec.write_text("rules:\n  - {op: stack, from: 'l(?P<i>\\d+)\\.(.*)', to: 'layers.\\2'}\n")
    r = cli("migrate", src, dst, "--spec", spec)
    assert r.code == 0, r.stderr
    got = read_values(dst, item="optimizer")
    was = read_values(src, item="optimizer")
    for moment in ("mu", "nu"):
        stacked = got[f"opt_state.0.{moment}.layers.kernel.value"]
        assert stacked.shape == (2, 8, 8)
        for i in (0, 1):
            np.testing.assert_array_equal(
                stacked[i], was[f"opt_state.0.{moment}.l{i}.kernel.value"]
            )
    assert "opt_state.0.mu.l0.kernel.value" not in got
    assert read_values(dst, item="model")["layers.bias.value"].shape == (2, 8)


def _train_step_on(model: Any, optimizer: Any) -> None:
    """One Adam step on a square-input loss (a model 8 -> 8), so the moments are not zero."""
    import jax.numpy as jnp
    from flax import nnx

    x = np.ones((2, 8), np.float32)
    optimizer.update(model, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model))
