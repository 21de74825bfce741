"""``ckpt doctor`` on the model changes users make, each pair written by the installed
Orbax/Flax: linen and nnx, ``nn.scan`` stacked and unrolled layers, a layer widened and renamed,
``optax.inject_hyperparams`` added, a head dropped or added, a transposed kernel, fused and split
heads, another model altogether, and a checkpoint saved on a (4, 2) mesh restored on 1 device
or on a (2, 4) mesh. For every pair the verdict equals what Orbax's ``StandardRestore`` into the
target does (a restore returning other shapes or dtypes than the target's is a failure), and
every ``restores-after-*`` fix gives a step that restores into the target and trains one step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.orbax_truth import orbax_restores

pytestmark = pytest.mark.slow

TARGETS = '''
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tests.support.doctor_models import (
    IN, OUT, H, MLP, Deep, NnxMLP, Other, adam, batch, xent,
)


def injected():
    return optax.inject_hyperparams(optax.adam)(learning_rate=1e-3)


MODELS = {
    "linen": (MLP(), adam), "aux": (MLP(aux=True), adam), "unrolled": (Deep(False), adam),
    "scanned": (Deep(True), adam), "wide_renamed": (MLP(128, ("encoder", "head")), adam),
    "injected": (MLP(), injected), "transposed": (MLP(kind="transposed"), adam),
    "heads": (MLP(kind="heads"), adam), "other": (Other(), adam),
}


def init_state(name):
    model, tx = MODELS[name]
    params = model.init(jax.random.key(0), jnp.zeros((1, IN)))["params"]
    return {"params": params, "opt_state": tx().init(params), "step": jnp.asarray(0, jnp.int32)}


def train_step(name, state):
    """One step of model ``name`` on a restored state: (the new state, the loss)."""
    model, tx = MODELS[name]
    value, grads = jax.value_and_grad(lambda p: xent(model.apply({"params": p}, batch()[0])))(
        state["params"])
    updates, opt = tx().update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt, "step": state["step"] + 1}, value


def nnx_train_step(state):
    """One step of the nnx model restored from ``state`` with a fresh nnx.Optimizer."""
    model = NnxMLP(nnx.Rngs(0))
    nnx.update(model, state)
    optimizer = nnx.Optimizer(model, adam(), wrt=nnx.Param)
    loss, grads = nnx.value_and_grad(lambda m: xent(m(batch()[0])))(model)
    optimizer.update(model, grads)
    return {"step": optimizer.step[...]}, loss


def params_train_step(restored):
    """Linen params alone (weights ported from nnx): a fresh optimizer, one step."""
    params = restored["params"]
    state = {"params": params, "opt_state": adam().init(params), "step": jnp.asarray(0, jnp.int32)}
    return train_step("linen", state)


def linen():
    return jax.eval_shape(lambda: init_state("linen"))


def linen_params():
    return {"params": linen()["params"]}


def nnx_state():
    return nnx.state(nnx.eval_shape(lambda: NnxMLP(rngs=nnx.Rngs(0))))


def _abstract(name):
    return lambda: jax.eval_shape(lambda: init_state(name))


aux, unrolled, scanned, wide_renamed, injected_state, transposed, heads, other = (
    _abstract(n) for n in
    ("aux", "unrolled", "scanned", "wide_renamed", "injected", "transposed", "heads", "other"))
'''

#: (saved, target, verdict, how the restored state trains: a model of MODELS, "nnx", "params")
PAIRS = [
    ("linen", "nnx_state", "restores-after-migrate", "nnx"),
    ("nnx", "linen_params", "restores-after-migrate", "params"),
    ("nnx", "nnx_state", "restores", "nnx"),
    ("unrolled", "scanned", "restores-after-migrate", "scanned"),
    ("scanned", "unrolled", "restores-after-migrate", "unrolled"),
    ("linen", "wide_renamed", "restores-after-migrate", "wide_renamed"),
    ("linen", "injected_state", "cannot", None),
    ("aux", "linen", "restores-after-migrate", "linen"),
    ("linen", "aux", "restores-after-migrate", "aux"),
    ("linen", "transposed", "restores-after-migrate", "transposed"),
    ("linen", "heads", "restores-after-migrate", "heads"),
    ("linen", "other", "cannot", None),
]
#: Pairs whose fix keeps what the model computes: the first step's loss equals the saved model's.
SAME_FUNCTION = {"nnx_state", "linen_params", "scanned", "unrolled", "wide_renamed", "aux"}
SAME_FUNCTION |= {"transposed", "heads"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each source model saved once (one training step in, as ``CheckpointManager`` saves it),
    with the loss its next step has; the target module importable."""
    import orbax.checkpoint as ocp
    from flax import nnx

    root = tmp_path_factory.mktemp("doctor_matrix")
    (root / "matrix_targets.py").write_text(textwrap.dedent(TARGETS))
    sys.path.insert(0, str(root))
    sys.modules.pop("matrix_targets", None)
    import matrix_targets as t

    states: dict[str, Any] = {}
    losses: dict[str, float] = {}
    for name in ("linen", "aux", "unrolled", "scanned"):
        state, _ = t.train_step(name, t.init_state(name))
        states[name] = state
        losses[name] = float(t.train_step(name, state)[1])
    model = t.NnxMLP(nnx.Rngs(0))
    states["nnx"] = nnx.state(model)
    losses["nnx"] = float(t.nnx_train_step(states["nnx"])[1])
    for name, state in states.items():
        with ocp.CheckpointManager(str(root / name)) as mgr:
            mgr.save(1, args=ocp.args.StandardSave(state))
            mgr.wait_until_finished()
    yield t, root, losses
    sys.path.remove(str(root))


def trains(t: Any, how: str, restored: Any) -> tuple[int, float]:
    if how == "nnx":
        state, loss = t.nnx_train_step(restored)
    elif how == "params":
        state, loss = t.params_train_step(restored)
    else:
        state, loss = t.train_step(how, restored)
    return int(state["step"]), float(loss)


@pytest.mark.parametrize(("saved", "target", "verdict", "how"), PAIRS)
def test_the_verdict_is_orbax_restore_and_the_fix_trains(
    cli, world, tmp_path: Path, saved: str, target: str, verdict: str, how: str | None
) -> None:  # type: ignore[no-untyped-def]
    t, root, losses = world
    ref = f"matrix_targets:{target}"
    r = cli(
        "doctor", root / saved, "--target", ref, "--write-spec", tmp_path / "fix.yaml", "--json"
    )
    assert r.code == (0 if verdict == "restores" else 1), r.stderr
    doc = r.json()
    assert doc["verdict"] == verdict, doc["differences"]
    abstract = getattr(t, target)()
    ok, restored = orbax_restores(root / saved, abstract)
    assert ok == (verdict == "restores")
    if verdict == "cannot":
        assert doc["reason"]
        return
    before = 0 if how in ("nnx", "params") else 1
    if verdict == "restores-after-migrate":
        fixed = tmp_path / "fixed"
        m = cli("migrate", root / saved, fixed, "--spec", tmp_path / "fix.yaml", "--target", ref)
        assert m.code == 0, m.stderr
        ok, restored = orbax_restores(fixed, abstract)
        assert ok
        again = cli("doctor", fixed, "--target", ref, "--json")
        assert again.json()["verdict"] == "restores", again.json()["differences"]
    assert how is not None
    step, loss = trains(t, how, restored)
    assert step == before + 1 and np.isfinite(loss)
    if target in SAME_FUNCTION:
        assert loss == pytest.approx(losses[saved], rel=1e-5)


MESH_TARGETS = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
S = jax.ShapeDtypeStruct
SPECS = {"kernel": P("data", None), "bias": P(), "embed": P("data", "model"), "step": P()}


def _state(mesh=None):
    def s(shape, dtype, spec):
        return S(shape, dtype, sharding=None if mesh is None else NamedSharding(mesh, SPECS[spec]))
    return {"params": {"dense": {"kernel": s((64, 32), jnp.float32, "kernel"),
                                 "bias": s((32,), jnp.float32, "bias")},
                       "embed": s((16, 8), jnp.bfloat16, "embed")},
            "step": s((), jnp.int32, "step")}


def unsharded():
    return _state()


def sharded(shape=(2, 4)):
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return _state(Mesh(devices, ("data", "model")))


def sharded_22():
    return sharded((2, 2))


def sharded_1():
    return sharded((1, 1))
"""

#: Restore in a process of N devices (argv: root, N, the target's mesh "2,4" or "" for none),
#: then one gradient step on the restored kernel.
RESTORE_ON = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + sys.argv[2]
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import jax, jax.numpy as jnp, orbax.checkpoint as ocp
import mesh_targets as t
shape = tuple(int(n) for n in sys.argv[3].split(",")) if sys.argv[3] else None
abstract = t.sharded(shape) if shape else t.unsharded()
try:
    with ocp.CheckpointManager(sys.argv[1]) as mgr:
        got = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore(abstract))
except ValueError as e:
    print(json.dumps({"ok": False, "error": str(e).splitlines()[0]}))
    sys.exit(0)
want = jax.tree.leaves(jax.tree.map(lambda a: (a.shape, str(a.dtype)), abstract))
have = jax.tree.leaves(jax.tree.map(lambda a: (a.shape, str(a.dtype)), got))
kernel = got["params"]["dense"]["kernel"]
x = jnp.ones((4, 64))
loss, grad = jax.value_and_grad(lambda k: jnp.sum((x @ k) ** 2))(kernel)
print(json.dumps({"ok": want == have, "spec": [str(p) for p in kernel.sharding.spec],
                  "mesh": list(kernel.sharding.mesh.devices.shape),
                  "loss": float(loss), "moved": bool(jnp.any(kernel - 1e-3 * grad != kernel))}))
"""


@pytest.fixture(scope="module")
def mesh_world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A step saved on a (4, 2) mesh of this process's 8 devices, and the targets module."""
    from tests.support.sharded import save_sharded

    root = tmp_path_factory.mktemp("doctor_mesh")
    (root / "mesh_targets.py").write_text(MESH_TARGETS)
    save_sharded(root / "run", (4, 2))
    sys.path.insert(0, str(root))
    sys.modules.pop("mesh_targets", None)
    yield root
    sys.path.remove(str(root))


def restore_on(root: Path, devices: int, mesh: str = "") -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_ON, str(root), str(devices), mesh],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def reshard_and_restore(cli, root: Path, rules: Path, mesh: str, devices: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    w = cli("reshard", root / "run", root / mesh, "--mesh", mesh, "--rules", rules)
    assert w.code == 0, w.stderr
    fixed = restore_on(root / mesh, devices)
    assert fixed["ok"] and fixed["moved"] and fixed["loss"] > 0, fixed
    return fixed


def test_saved_on_8_devices_restored_on_1_after_the_doctors_reshard(
    cli, mesh_world: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    failed = restore_on(mesh_world / "run", 1)
    assert not failed["ok"] and "Topology mismatch" in failed["error"]
    args = ("doctor", mesh_world / "run", "--target", "mesh_targets:unsharded", "--mesh")
    r = cli(*args, "data=1", "--write-spec", tmp_path / "rules.yaml", "--json")
    assert r.code == 1 and r.json()["verdict"] == "restores-after-reshard", r.stdout
    fixed = reshard_and_restore(cli, mesh_world, tmp_path / "rules.yaml", "data=1", 1)
    assert fixed["mesh"] == [1] and fixed["spec"] == ["data", "None"]
    again = cli("doctor", mesh_world / "data=1", *args[2:], "data=1", "--json")
    assert again.code == 0 and again.json()["verdict"] == "restores"


@pytest.mark.parametrize(
    ("target", "devices", "mesh"),
    [("sharded", 8, "2,4"), ("sharded_22", 4, "2,2"), ("sharded_1", 1, "1,1")],
)
def test_a_target_that_names_its_shardings_restores_on_any_mesh(
    cli, mesh_world: Path, target: str, devices: int, mesh: str
) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", mesh_world / "run", "--target", f"mesh_targets:{target}", "--json")
    assert r.code == 0 and r.json()["verdict"] == "restores", r.stdout
    assert r.json()["differences"] == []
    got = restore_on(mesh_world / "run", devices, mesh)
    assert got["ok"] and got["mesh"] == [int(n) for n in mesh.split(",")] and got["moved"]


def test_a_mesh_change_without_shardings_restores_on_the_saved_layout(
    cli, mesh_world: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    args = ("doctor", mesh_world / "run", "--target", "mesh_targets:unsharded")
    r = cli(*args, "--mesh", "data=2,model=4", "--write-spec", tmp_path / "rules.yaml", "--json")
    assert r.code == 0 and r.json()["verdict"] == "restores", r.stdout
    [note] = r.json()["differences"]
    assert note["kind"] == "topology" and not note["blocks"] and note["reshard"] == "data=2,model=4"
    as_saved = restore_on(mesh_world / "run", 8)
    assert as_saved["ok"] and as_saved["mesh"] == [4, 2]  # what the note says: the saved layout
    fixed = reshard_and_restore(cli, mesh_world, tmp_path / "rules.yaml", "data=2,model=4", 8)
    assert fixed["mesh"] == [2, 4] and fixed["spec"] == ["data", "None"]
