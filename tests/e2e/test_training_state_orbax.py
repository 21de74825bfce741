"""A step that ``inspect`` calls a complete training state resumes: Orbax restores its items
with the API the user calls (``CheckpointManager.restore`` of a Composite of
``StandardRestore`` into ``nnx.eval_shape`` / ``jax.eval_shape`` abstract targets), and one
training step from the restored state is the uninterrupted run's next step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_nnx_model_and_optimizer_resume_one_step(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from tests.support import training_states as ts

    root = tmp_path / "run"
    run = ts.nnx_run(root)
    doc = cli("inspect", root, "--json").json()["training_state"]
    assert doc["complete"] is True and doc["items"] == ["model", "optimizer"]

    abstract_model = nnx.eval_shape(lambda: ts.NnxMLP(nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract_model)
    abstract_opt = nnx.eval_shape(
        lambda: nnx.Optimizer(ts.NnxMLP(nnx.Rngs(0)), ts.TX, wrt=nnx.Param)
    )
    with ocp.CheckpointManager(root) as mgr:
        step = mgr.latest_step()
        restored = mgr.restore(
            step,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(abstract_state),
                optimizer=ocp.args.StandardRestore(nnx.state(abstract_opt)),
            ),
        )
    model = nnx.merge(graphdef, restored.model)
    optimizer = nnx.Optimizer(model, ts.TX, wrt=nnx.Param)
    nnx.update(optimizer, restored.optimizer)
    assert step == ts.SAVED_STEP and int(optimizer.step[...]) == ts.SAVED_STEP

    batch = next(run.data)
    loss = ts.nnx_step(model, optimizer, batch)
    expected = ts.nnx_step(run.model, run.optimizer, batch)
    assert int(optimizer.step[...]) == ts.SAVED_STEP + 1
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(run.model)), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_trainstate_and_data_iterator_resume_one_step(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp

    from tests.support import training_states as ts

    root = tmp_path / "run"
    run = ts.linen_run(root)
    doc = cli("inspect", root, "--json").json()["training_state"]
    order = next(p for p in doc["parts"] if p["part"] == "data_order")
    assert doc["complete"] is True and order["items"] == ["data_iter"]

    abstract = jax.eval_shape(lambda: ts.linen_state(ts.LinenMLP(), next(ts.DataIter())[0]))
    with ocp.CheckpointManager(root) as mgr:
        step = mgr.latest_step()
        restored = mgr.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), data_iter=ocp.args.JsonRestore()
            ),
        )
    state = restored.state
    data = ts.DataIter()
    data.set_state(restored.data_iter)
    assert step == ts.SAVED_STEP and int(state.step) == ts.SAVED_STEP

    # The restored iterator continues the data order: the same batch as the run that went on.
    batch = next(data)
    expected_batch = next(run.data)
    np.testing.assert_array_equal(np.asarray(batch[0]), np.asarray(expected_batch[0]))
    state, loss = ts.linen_step(state, batch)
    expected_state, expected_loss = ts.linen_step(run.state, expected_batch)
    assert int(state.step) == ts.SAVED_STEP + 1
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    for a, b in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(expected_state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
