"""``ckpt doctor CKPT --like OTHER`` where the state to restore into is another Orbax checkpoint
or its safetensors export (``ckpt export``), each written by the installed Orbax/Flax: a module
renamed, a layer widened, bf16, ``nn.scan`` stacked and unrolled layers, an optimizer chained with
gradient clipping, another input width. For every pair the verdict equals what Orbax's
``StandardRestore`` of CKPT into OTHER's abstract state does, and every ``restores-after-migrate``
spec, given to ``ckpt migrate`` without ``--target`` (the doctor checked it against OTHER), gives
a step that restores into that state and trains one step. Then an nnx model saved with its
``nnx.Optimizer`` state, restored into a renamed and widened model and its optimizer."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.orbax_truth import orbax_restores

pytestmark = pytest.mark.slow

MODELS = """
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tests.support.doctor_models import IN, OUT, H, MLP, Deep, Net, adam, batch, xent


def chained():
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))


#: name -> (model, optimizer, input width, params dtype)
KINDS = {
    "narrow": (MLP(), adam, IN, jnp.float32),
    "renamed": (MLP(H, ("encoder", "head")), adam, IN, jnp.float32),
    "wide": (MLP(128), adam, IN, jnp.float32),
    "bf16": (MLP(), adam, IN, jnp.bfloat16),
    "unrolled": (Deep(False), adam, IN, jnp.float32),
    "scanned": (Deep(True), adam, IN, jnp.float32),
    "chained": (MLP(), chained, IN, jnp.float32),
    "other_input": (MLP(128), adam, 20, jnp.float32),
}


def init_state(kind):
    model, tx, width, dtype = KINDS[kind]
    params = model.init(jax.random.key(0), jnp.zeros((1, width)))["params"]
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    return {"params": params, "opt_state": tx().init(params), "step": jnp.asarray(0, jnp.int32)}


def abstract(kind):
    return jax.eval_shape(lambda: init_state(kind))


def train_step(kind, state):
    model, tx, width, _ = KINDS[kind]
    loss, grads = jax.value_and_grad(lambda p: xent(model.apply({"params": p}, batch(width)[0])))(
        state["params"])
    updates, opt = tx().update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt, "step": state["step"] + 1}, loss


NEW = (128, ("encoder", "head"))


def nnx_pair(hidden=H, names=("Dense_0", "Dense_1")):
    model = Net(nnx.Rngs(0), hidden, names)
    return model, nnx.Optimizer(model, adam(), wrt=nnx.Param)


def nnx_saved(model, optimizer):
    \"\"\"What is saved: the model's state and its optimizer's (step and optax state).\"\"\"
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def nnx_step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: xent(m(batch()[0])))(model)
    optimizer.update(model, grads)
    return loss


def nnx_new():
    \"\"\"The renamed and widened model with its optimizer, as nnx.eval_shape gives them.\"\"\"
    return nnx_saved(*nnx.eval_shape(lambda: nnx_pair(*NEW)))


def nnx_new_resumed(restored):
    \"\"\"The new model and optimizer with the restored state, and one step's loss.\"\"\"
    model, optimizer = nnx.eval_shape(lambda: nnx_pair(*NEW))
    nnx.update(model, restored["model"])
    nnx.update(optimizer, restored["optimizer"])
    return optimizer, nnx_step(model, optimizer)
"""

#: (saved, like, verdict)
PAIRS = [
    ("narrow", "narrow", "restores"),
    ("narrow", "renamed", "restores-after-migrate"),
    ("narrow", "wide", "restores-after-migrate"),
    ("narrow", "bf16", "restores"),
    ("unrolled", "scanned", "restores-after-migrate"),
    ("scanned", "unrolled", "restores-after-migrate"),
    ("narrow", "chained", "cannot"),
    ("narrow", "other_input", "cannot"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every kind saved one training step in, as ``CheckpointManager`` saves it, with the loss of
    its next step; the models module importable."""
    import orbax.checkpoint as ocp

    root = tmp_path_factory.mktemp("doctor_like")
    (root / "like_models.py").write_text(textwrap.dedent(MODELS))
    sys.path.insert(0, str(root))
    sys.modules.pop("like_models", None)
    import like_models as t

    losses: dict[str, float] = {}
    for kind in t.KINDS:
        state, _ = t.train_step(kind, t.init_state(kind))
        losses[kind] = float(t.train_step(kind, state)[1])
        with ocp.CheckpointManager(str(root / kind)) as mgr:
            mgr.save(1, args=ocp.args.StandardSave(state))
            mgr.wait_until_finished()
    yield t, root, losses
    sys.path.remove(str(root))


def other_path(cli, root: Path, like: str, form: str, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    if form == "checkpoint":
        return root / like
    exported = tmp_path / f"{like}.safetensors"
    r = cli("export", root / like, exported)
    assert r.code == 0, r.stderr
    return exported


@pytest.mark.parametrize("form", ["checkpoint", "safetensors"])
@pytest.mark.parametrize(("saved", "like", "verdict"), PAIRS)
def test_like_a_checkpoint_or_its_export_is_what_orbax_restore_does(
    cli, world, tmp_path: Path, saved: str, like: str, verdict: str, form: str
) -> None:  # type: ignore[no-untyped-def]
    t, root, losses = world
    other = other_path(cli, root, like, form, tmp_path)
    fix = tmp_path / "fix.yaml"
    r = cli("doctor", root / saved, "--like", other, "--write-spec", fix, "--json")
    assert r.code == (0 if verdict == "restores" else 1), r.stderr
    doc = r.json()
    assert doc["verdict"] == verdict, doc["differences"]
    abstract = t.abstract(like)
    ok, restored = orbax_restores(root / saved, abstract)
    assert ok == (verdict == "restores")
    if verdict == "cannot":
        assert doc["reason"]
        if like == "chained":  # the optax EmptyState nodes: known from the export's ckpt.tree
            assert "container" in {d["kind"] for d in doc["differences"]}
        return
    if verdict == "restores-after-migrate":
        fixed = tmp_path / "fixed"
        m = cli("migrate", root / saved, fixed, "--spec", fix)
        assert m.code == 0, m.stderr
        ok, restored = orbax_restores(fixed, abstract)
        assert ok
        again = cli("doctor", fixed, "--like", other, "--json")
        assert again.code == 0 and again.json()["verdict"] == "restores", again.stdout
    state, loss = t.train_step(like, restored)
    assert int(state["step"]) == 2 and np.isfinite(float(loss))
    if like != "bf16":  # the fix keeps what the model computes: the saved model's next loss
        assert float(loss) == pytest.approx(losses[saved], rel=1e-5)


def test_the_params_of_an_export_take_the_optimizers_empty_node_out(
    cli, world, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """``--like`` an ``export --params-only``: its ``ckpt.tree`` says the target holds no
    optimizer, so the saved optax ``EmptyState`` is dropped with the rest of it (without the
    tree it stays, and Orbax refuses the migrated step); the params restore and train."""
    t, root, losses = world
    params = tmp_path / "params.safetensors"
    assert cli("export", root / "narrow", params, "--params-only").code == 0
    fix = tmp_path / "fix.yaml"
    r = cli("doctor", root / "narrow", "--like", params, "--write-spec", fix, "--json")
    assert r.code == 1 and r.json()["verdict"] == "restores-after-migrate", r.stdout
    dropped = {d["stored"][0] for d in r.json()["differences"] if d["kind"] == "unexpected"}
    assert "opt_state.1" in dropped
    text = cli("doctor", root / "narrow", "--like", params)  # the spec needs no --target
    assert "next: ckpt migrate" in text.stdout and "--target" not in text.stdout, text.stdout
    abstract = {"params": t.abstract("narrow")["params"]}
    assert not orbax_restores(root / "narrow", abstract)[0]
    assert cli("migrate", root / "narrow", tmp_path / "fixed", "--spec", fix).code == 0
    ok, restored = orbax_restores(tmp_path / "fixed", abstract)
    assert ok
    fresh = {**t.init_state("narrow"), "params": restored["params"]}
    state, loss = t.train_step("narrow", fresh)
    assert int(state["step"]) == 1 and float(loss) == pytest.approx(losses["narrow"], rel=1e-5)


def test_files_without_the_tree_say_nothing_of_empty_nodes(cli, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same tensors as the chained optimizer's export, written by the safetensors library
    (no ``ckpt.tree``): no ``container`` difference can be named; the verdict is still
    ``cannot`` (the planned renames collide with the saved empty node), as Orbax's restore."""
    from safetensors.numpy import load, save_file

    t, root, _ = world
    exported = tmp_path / "chained.safetensors"
    assert cli("export", root / "chained", exported).code == 0
    bare = tmp_path / "bare"
    bare.mkdir()
    files = sorted(exported.glob("*.safetensors")) if exported.is_dir() else [exported]
    assert files
    for f in files:  # the same tensors, no metadata
        save_file(load(f.read_bytes()), str(bare / f.name))
    r = cli("doctor", root / "narrow", "--like", bare, "--json")
    assert r.json()["verdict"] == "cannot", r.json()
    assert "container" not in {d["kind"] for d in r.json()["differences"]}
    assert not orbax_restores(root / "narrow", t.abstract("chained"))[0]


def test_nnx_model_and_optimizer_renamed_and_widened(cli, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An nnx model saved with its ``nnx.Optimizer`` state (``nnx.state(optimizer)``), two steps
    in; the new model renames both layers and widens the first: the doctor's spec, through
    ``ckpt migrate``, gives a step that restores into ``nnx.eval_shape`` of the new model and
    optimizer, and the optimizer resumes at its step with the loss the saved model had next."""
    import orbax.checkpoint as ocp

    t, _, _ = world
    model, optimizer = t.nnx_pair()
    for _ in range(2):
        t.nnx_step(model, optimizer)
    with ocp.CheckpointManager(str(tmp_path / "nnx")) as mgr:
        mgr.save(2, args=ocp.args.StandardSave(t.nnx_saved(model, optimizer)))
        mgr.wait_until_finished()
    expected_loss = float(t.nnx_step(model, optimizer))
    target = "like_models:nnx_new"
    fix = tmp_path / "fix.yaml"
    r = cli("doctor", tmp_path / "nnx", "--target", target, "--write-spec", fix, "--json")
    assert r.code == 1 and r.json()["verdict"] == "restores-after-migrate", r.stdout
    kinds = {d["kind"] for d in r.json()["differences"]}
    assert {"rename", "padded"} <= kinds
    assert "lecun_normal" in fix.read_text()  # the new units' inputs, as nnx.Linear's default
    assert not orbax_restores(tmp_path / "nnx", t.nnx_new())[0]
    m = cli("migrate", tmp_path / "nnx", tmp_path / "fixed", "--spec", fix, "--target", target)
    assert m.code == 0, m.stderr
    ok, restored = orbax_restores(tmp_path / "fixed", t.nnx_new())
    assert ok
    new_optimizer, loss = t.nnx_new_resumed(restored)
    assert int(new_optimizer.step[...]) == 3 and np.isfinite(float(loss))
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)
