"""``ckpt doctor`` against what real Orbax does: for each (checkpoint, target) pair the verdict
equals the outcome of ``CheckpointManager.restore(step, args=StandardRestore(abstract))`` (a
restore that returns arrays of other shapes than the target's counts as failed: Orbax 0.12
returns the stored shape to an unsharded target), and every ``restores-after-migrate`` spec,
given to ``ckpt migrate``, yields a step that restores into the target and trains one step."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.orbax_truth import orbax_restores

pytestmark = pytest.mark.slow

TARGETS = """
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tests.support.doctor_models import MLP  # the input width comes from the data

IN_DIM, OUT_DIM = 16, 10


def init_state(hidden=64, names=("Dense_0", "Dense_1"), dtype=jnp.float32, in_dim=IN_DIM):
    key = jax.random.key(0)
    params = MLP(hidden, names).init(key, jnp.zeros((1, in_dim)))["params"]
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    return {"params": params, "opt_state": optax.adam(1e-3).init(params),
            "step": jnp.asarray(0, jnp.int32)}


def train_step(state, hidden=64, names=("Dense_0", "Dense_1")):
    rs = jax.random.key(1)
    x = jax.random.normal(rs, (32, IN_DIM))
    y = jnp.arange(32) % OUT_DIM
    def loss(p):
        logits = MLP(hidden, names).apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    value, grads = jax.value_and_grad(loss)(state["params"])
    updates, opt = optax.adam(1e-3).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt, "step": state["step"] + 1}, value


def same():
    return jax.eval_shape(lambda: init_state(64))


def wide():
    return jax.eval_shape(lambda: init_state(128))


def renamed():
    return jax.eval_shape(lambda: init_state(64, ("encoder", "head")))


def bf16():
    return jax.eval_shape(lambda: init_state(64, dtype=jnp.bfloat16))


def other_input():
    return jax.eval_shape(lambda: init_state(128, in_dim=20))


def chained():
    # The optimizer became optax.chain(clip_by_global_norm, adam): its state tree changed.
    def build():
        state = init_state(64)
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
        return {**state, "opt_state": tx.init(state["params"])}
    return jax.eval_shape(build)


def raw_key():
    return {"rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))}


def typed_key():
    return {"rng": jax.eval_shape(lambda: jax.random.key(0))}
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A narrow model's step 3 saved as the Orbax docs show, and the target module."""
    import orbax.checkpoint as ocp

    (tmp_path / "doctor_targets.py").write_text(textwrap.dedent(TARGETS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("doctor_targets", None)
    import doctor_targets as t

    state = t.init_state(64)
    for _ in range(3):
        state, _ = t.train_step(state)
    with ocp.CheckpointManager(str(tmp_path / "narrow")) as mgr:
        mgr.save(3, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return t


CASES = [
    ("same", "restores"),
    ("bf16", "restores"),
    ("wide", "restores-after-migrate"),
    ("renamed", "restores-after-migrate"),
    ("other_input", "cannot"),
    ("chained", "cannot"),
]


@pytest.mark.parametrize(("target", "verdict"), CASES)
def test_the_verdict_is_what_orbax_restore_does(
    cli, world, tmp_path: Path, target: str, verdict: str
) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", tmp_path / "narrow", "--target", f"doctor_targets:{target}", "--json")
    assert r.code == (0 if verdict == "restores" else 1), r.stderr
    doc = r.json()
    assert doc["verdict"] == verdict, doc["differences"]
    abstract = getattr(world, target)()
    ok, _ = orbax_restores(tmp_path / "narrow", abstract)
    assert ok == (verdict == "restores")
    if target == "other_input":
        assert doc["reason"] and "no rule maps" in doc["reason"]
    if target == "chained":
        kinds = {d["kind"] for d in doc["differences"]}
        assert {"container", "rename"} <= kinds and "Orbax refuses" in doc["reason"]


@pytest.mark.parametrize("target", ["wide", "renamed"])
def test_the_written_spec_migrates_to_a_step_that_restores_and_trains(
    cli, world, tmp_path: Path, target: str
) -> None:  # type: ignore[no-untyped-def]
    ref = f"doctor_targets:{target}"
    r = cli("doctor", tmp_path / "narrow", "--target", ref, "--write-spec", "fix.yaml")
    assert r.code == 1 and "restores after `ckpt migrate`" in r.stdout, r.stderr
    m = cli(
        "migrate", tmp_path / "narrow", tmp_path / "fixed", "--spec", "fix.yaml", "--target", ref
    )
    assert m.code == 0, m.stderr
    again = cli("doctor", tmp_path / "fixed", "--target", ref, "--json")
    assert again.code == 0 and again.json()["verdict"] == "restores"
    ok, restored = orbax_restores(tmp_path / "fixed", getattr(world, target)())
    assert ok
    hidden, names = (128, ("Dense_0", "Dense_1")) if target == "wide" else (64, ("encoder", "head"))
    trained, loss = world.train_step(restored, hidden, names)
    assert int(trained["step"]) == 4 and np.isfinite(float(loss))
    # The spec keeps what the model computes: new inputs start at zero, renamed leaves keep values.
    narrow = orbax_restores(tmp_path / "narrow", world.same())[1]
    assert float(loss) == pytest.approx(float(world.train_step(narrow)[1]), rel=1e-5)


def test_like_a_checkpoint_or_its_safetensors_needs_no_jax(cli, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(tmp_path / "wide")) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(world.init_state(128)))
        mgr.wait_until_finished()
    assert cli("export", tmp_path / "wide", tmp_path / "wide.safetensors").code == 0
    for like in (tmp_path / "wide", tmp_path / "wide.safetensors"):
        r = cli("doctor", tmp_path / "narrow", "--like", like, "--json")
        assert r.code == 1, r.stderr
        doc = r.json()
        assert doc["verdict"] == "restores-after-migrate"
        padded = sorted(d["expected"][0] for d in doc["differences"] if d["kind"] == "padded")
        assert "params.Dense_0.kernel" in padded and len(padded) == 9


@pytest.mark.parametrize(
    ("saved", "target", "verdict"),
    [
        ("raw", "raw_key", "restores"),
        ("raw", "typed_key", "cannot"),
        ("typed", "typed_key", "restores"),
        ("typed", "raw_key", "cannot"),
    ],
)
def test_typed_and_raw_prng_keys_are_told_apart(
    cli, world, tmp_path: Path, saved: str, target: str, verdict: str
) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp

    key = jax.random.key(0)
    root = tmp_path / saved
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(
            1,
            args=ocp.args.StandardSave(
                {"rng": key if saved == "typed" else jax.random.key_data(key)}
            ),
        )
        mgr.wait_until_finished()
    r = cli("doctor", root, "--target", f"doctor_targets:{target}", "--json")
    assert r.json()["verdict"] == verdict, r.json()
    assert orbax_restores(root, getattr(world, target)())[0] == (verdict == "restores")
    if verdict == "cannot":
        [d] = r.json()["differences"]
        assert d["kind"] == "key" and "jax.random" in d["message"]


RESTORE_ON = r"""
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + sys.argv[2]
import jax, jax.numpy as jnp, orbax.checkpoint as ocp
S = jax.ShapeDtypeStruct
abstract = {"params": {"dense": {"kernel": S((64, 32), jnp.float32), "bias": S((32,), jnp.float32)},
                       "embed": S((16, 8), jnp.bfloat16)}, "step": S((), jnp.int32)}
try:
    with ocp.CheckpointManager(sys.argv[1]) as mgr:
        got = mgr.restore(mgr.latest_step(), args=ocp.args.StandardRestore(abstract))
except ValueError as e:
    print(json.dumps({"ok": False, "error": str(e).splitlines()[0]}))
    sys.exit(0)
kernel = got["params"]["dense"]["kernel"]
x = jnp.ones((4, 64))
loss, grad = jax.value_and_grad(lambda k: jnp.sum((x @ k) ** 2))(kernel)
trained = kernel - 1e-3 * grad
print(json.dumps({"ok": True, "spec": [str(p) for p in kernel.sharding.spec],
                  "devices": len(kernel.sharding.device_set), "loss": float(loss),
                  "moved": bool(jnp.any(trained != kernel))}))
"""

SHARDED_TARGET = """
import jax, jax.numpy as jnp
S = jax.ShapeDtypeStruct


def unsharded():
    return {"params": {"dense": {"kernel": S((64, 32), jnp.float32), "bias": S((32,), jnp.float32)},
                       "embed": S((16, 8), jnp.bfloat16)}, "step": S((), jnp.int32)}
"""


def restore_on(root: Path, devices: int) -> dict[str, Any]:
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", RESTORE_ON, str(root), str(devices)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_saved_on_8_devices_restored_on_4_needs_a_reshard_that_keeps_the_specs(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    from tests.support.sharded import save_sharded

    (tmp_path / "sharded_target.py").write_text(SHARDED_TARGET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    save_sharded(tmp_path / "run", (4, 2))
    failed = restore_on(tmp_path / "run", 4)
    assert not failed["ok"] and "Topology mismatch" in failed["error"]

    args = ("doctor", tmp_path / "run", "--target", "sharded_target:unsharded")
    same = cli(*args, "--mesh", "data=4,model=2", "--json")
    assert same.code == 0 and same.json()["verdict"] == "restores", same.stdout
    assert restore_on(tmp_path / "run", 8)["ok"]  # the truth of that verdict
    r = cli(*args, "--mesh", "data=4", "--write-spec", "rules.yaml", "--json")
    assert r.code == 1, r.stderr
    doc = r.json()
    assert doc["verdict"] == "restores-after-reshard"
    [topology] = doc["differences"]
    assert topology["kind"] == "topology" and topology["reshard"] == "data=4"
    assert "Topology mismatch" in topology["message"]

    w = cli(
        "reshard", tmp_path / "run", tmp_path / "run4", "--mesh", "data=4", "--rules", "rules.yaml"
    )
    assert w.code == 0, w.stderr
    fixed = restore_on(tmp_path / "run4", 4)
    assert fixed["ok"] and fixed["spec"] == ["data", "None"] and fixed["devices"] == 4
    assert fixed["moved"] and fixed["loss"] > 0
    again = cli("doctor", tmp_path / "run4", *args[2:], "--mesh", "data=4", "--json")
    assert again.json()["verdict"] == "restores"
