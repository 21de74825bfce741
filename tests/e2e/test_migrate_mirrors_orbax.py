"""``ckpt migrate`` on a mixed-precision training state (``examples/mixed_precision.py``): the
float32 master copy and the EMA of the parameters follow a rename and a resize written for
``params``, a cast of ``params`` leaves them float32, Orbax restores the result into the new
model's state and training resumes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import REPO
from tests.support.sharded import read_values

pytestmark = pytest.mark.slow

NARROW, WIDE = 16, 32
SPEC = REPO / "examples" / "rename_and_widen_mixed.yaml"
TARGET = "examples.mixed_precision:abstract_wide"


def test_master_and_ema_follow_params_restore_and_train(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    from examples import mixed_precision as mp

    x, y = mp.make_data()
    narrow_step = mp.make_train_step()
    state = mp.init_state()
    for _ in range(3):
        state, _ = narrow_step(state, x, y)
    src, dst = tmp_path / "src", tmp_path / "dst"
    with ocp.CheckpointManager(str(src)) as mgr:
        mgr.save(3, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    monkeypatch.chdir(REPO)  # --target imports examples.mixed_precision from the working directory

    plan = cli("migrate", src, dst, "--spec", SPEC, "--target", TARGET, "--dry-run", "--json")
    assert plan.code == 0, plan.stderr
    assert plan.json()["target"]["differences"] == []
    ops = {leaf["name"]: leaf["operations"] for leaf in plan.json()["leaves"]}
    followed = [("rename", "params.Dense_0.kernel"), ("resize", "params.hidden.kernel")]
    for follower in ("master_params", "ema_params", "opt_state.0.mu", "opt_state.0.nu"):
        steps = ops[f"{follower}.hidden.kernel"]
        assert [(s["op"], s["follows"]) for s in steps] == followed
    assert [s["op"] for s in ops["params.hidden.kernel"]] == ["rename", "resize", "cast"]
    text = cli("migrate", src, dst, "--spec", SPEC, "--dry-run")
    assert "master_params.hidden.kernel" in text.stdout
    assert "(follows params.Dense_0.kernel)" in text.stdout
    families = "opt_state.0.mu (2 leaves), opt_state.0.nu (2 leaves), master_params (2 leaves)"
    assert f"rule 1 (rename) also changed {families}, ema_params (2 leaves)" in text.stdout

    r = cli("migrate", src, dst, "--spec", SPEC, "--target", TARGET)
    assert r.code == 0, r.stderr
    master, ema = check_values(read_values(src), read_values(dst))

    abstract = mp.abstract_wide()
    with ocp.CheckpointManager(str(dst)) as mgr:
        restored = mgr.restore(3, args=ocp.args.StandardRestore(abstract))
    assert restored.master_params["hidden"]["kernel"].dtype == jnp.float32
    assert restored.params["hidden"]["kernel"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(restored.master_params["hidden"]["kernel"]), master)
    np.testing.assert_array_equal(np.asarray(restored.ema_params["hidden"]["kernel"]), ema)
    assert int(restored.step) == 3 and int(restored.opt_state[0].count) == 3

    _, narrow_loss = narrow_step(state, x, y)
    wide_step = mp.make_train_step(WIDE, renamed=True, dtype=jnp.float16)
    trained, wide_loss = wide_step(restored, x, y)
    assert np.isfinite(float(wide_loss)) and int(trained.step) == 4
    # New hidden units feed zero output weights: the wide model computes what the narrow one did.
    assert float(wide_loss) == pytest.approx(float(narrow_loss), rel=1e-5)
    _, next_loss = wide_step(trained, x, y)
    assert float(next_loss) < float(wide_loss)


def check_values(
    before: dict[str, np.ndarray], after: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The migrated leaves: master and EMA renamed, widened with the parameters' own new values
    and still float32; the moments widened with zeros; the parameters float16."""
    import ml_dtypes

    assert after["params.hidden.kernel"].dtype == np.float16  # the cast reached params only
    for tree in ("master_params", "ema_params"):
        old, new = before[f"{tree}.Dense_0.kernel"], after[f"{tree}.hidden.kernel"]
        assert new.dtype == np.float32 and new.shape == (8, WIDE)
        assert new[:, :NARROW].tobytes() == old.tobytes()  # float32 bits kept
        assert f"{tree}.Dense_0.kernel" not in after
        assert np.all(after[f"{tree}.Dense_1.kernel"][NARROW:] == 0)
    master, ema = after["master_params.hidden.kernel"], after["ema_params.hidden.kernel"]
    assert np.abs(master[:, NARROW:]).max() > 0
    np.testing.assert_array_equal(ema[:, NARROW:], master[:, NARROW:])
    # The parameters drew the same values as bfloat16 (the resize precedes the cast to float16).
    drawn = master[:, NARROW:].astype(ml_dtypes.bfloat16).astype(np.float16)
    np.testing.assert_array_equal(after["params.hidden.kernel"][:, NARROW:], drawn)
    for moment in ("mu", "nu"):
        padded = after[f"opt_state.0.{moment}.hidden.kernel"]
        assert padded.shape == (8, WIDE) and np.all(padded[:, NARROW:] == 0)
    return master, ema
