"""Writers keep the source's step naming: a reshard of a ``flax.training.checkpoints`` run and
of a CheckpointManager root with ``step_prefix``/``step_format_fixed_length`` is restored by
the same API that saved it. The ``flax.training.checkpoints`` run is a linen ``TrainState``
(Adam) that resumes: one training step from the restored state is the uninterrupted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow


FLAX_STEP = 6


def _train() -> tuple[Any, Any]:
    """A linen TrainState trained ``FLAX_STEP`` steps with Adam, and the data that goes on."""
    from tests.support import training_states as ts

    data = ts.DataIter()
    state = ts.linen_state(ts.LinenMLP(), next(ts.DataIter())[0])
    for _ in range(FLAX_STEP):
        state, _ = ts.linen_step(state, next(data))
    return state, data


def _restore_and_resume(root: Path, run: tuple[Any, Any], step: int) -> None:
    """``restore_checkpoint`` into a fresh TrainState (the user's target), then one training
    step: the step counter advances, the loss is finite and equals the uninterrupted run's."""
    import jax
    from flax.training import checkpoints

    from tests.support import training_states as ts

    state, data = run
    target = ts.linen_state(ts.LinenMLP(), next(ts.DataIter())[0])
    restored = checkpoints.restore_checkpoint(str(root), target=target)
    assert restored is not None and int(restored.step) == step
    assert int(restored.opt_state[0].count) == FLAX_STEP  # Adam's moments came back too
    batch = next(data)
    resumed, loss = ts.linen_step(restored, batch)
    expected, expected_loss = ts.linen_step(state, batch)
    assert int(resumed.step) == step + 1
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    leaves = jax.tree.leaves(resumed.params)
    assert leaves
    for a, b in zip(leaves, jax.tree.leaves(expected.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


TREE = {"w": np.arange(4, dtype=np.float32)}


def _manager(root: Path) -> Any:
    """A CheckpointManager naming its steps ``ckpt_00007`` (prefix and fixed length)."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(step_prefix="ckpt", step_format_fixed_length=5)
    return ocp.CheckpointManager(
        str(root), options=options, item_handlers=ocp.StandardCheckpointHandler()
    )


def _save_prefixed(root: Path) -> None:
    import orbax.checkpoint as ocp

    with _manager(root) as mgr:
        mgr.save(7, args=ocp.args.StandardSave(TREE))
        mgr.wait_until_finished()
    assert (root / "ckpt_00007").is_dir()


def _restore_prefixed(root: Path, steps: list[int]) -> None:
    """The manager with the same options lists ``steps`` and restores the last one."""
    import orbax.checkpoint as ocp

    with _manager(root) as mgr:
        assert mgr.all_steps() == steps
        restored = mgr.restore(steps[-1], args=ocp.args.StandardRestore(TREE))
    np.testing.assert_array_equal(restored["w"], TREE["w"])


def test_reshard_of_flax_training_checkpoints_restores_with_restore_checkpoint(
    cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from flax.training import checkpoints

    src, dst = tmp_path / "src", tmp_path / "dst"
    run = _train()
    checkpoints.save_checkpoint(str(src), run[0], step=FLAX_STEP)
    assert [p.name for p in src.iterdir()] == ["checkpoint_6"]
    assert cli("verify", src, "--record").code == 0

    r = cli("reshard", src, dst, "--mesh", "data=1", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"] == str(dst / "checkpoint_6")
    # The step is its own item again, its digest record written after its metadata.
    assert not (dst / "checkpoint_6" / "default").exists()
    assert (dst / "checkpoint_6" / "_CKPT_DIGESTS.json").is_file()
    v = cli("verify", dst, "--deep")
    assert v.code == 0, v.stdout + v.stderr

    assert checkpoints.latest_checkpoint(str(dst)) == str(dst / "checkpoint_6")
    _restore_and_resume(dst, run, FLAX_STEP)


def test_reshard_keeps_step_prefix_and_fixed_length(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst = tmp_path / "src", tmp_path / "dst"
    _save_prefixed(src)

    r = cli("reshard", src, dst, "--mesh", "data=1", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"] == str(dst / "ckpt_00007")
    _restore_prefixed(dst, [7])


def test_migrate_step_out_keeps_the_flax_form_and_digests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from flax.training import checkpoints

    src, dst = tmp_path / "src", tmp_path / "dst"
    run = _train()
    checkpoints.save_checkpoint(str(src), run[0], step=FLAX_STEP)
    assert cli("verify", src, "--record").code == 0
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: set, match: step, value: 7}\n")

    r = cli("migrate", src, dst, "--spec", spec, "--step-out", "7", "--json")
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["checkpoint_7"]

    v = cli("verify", dst, "--deep")
    assert v.code == 0, v.stdout + v.stderr
    # The spec set the step counter to 7; everything else is the run's step 6.
    _restore_and_resume(dst, run, 7)


def test_import_into_a_prefixed_root_names_the_step_as_its_steps(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root, exported = tmp_path / "root", tmp_path / "exported"
    _save_prefixed(root)
    e = cli("export", root, exported)
    assert e.code == 0, e.stderr
    files = sorted(exported.glob("*.safetensors"))
    assert len(files) == 1, sorted(p.name for p in exported.iterdir())

    r = cli("import", files[0], root, "--step", "8")
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["ckpt_00007", "ckpt_00008"]
    _restore_prefixed(root, [7, 8])
