"""``ckpt migrate`` proven with real Orbax: restore into the new model and train; 8 devices."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO
from tests.support.sharded import read_values, save_sharded

pytestmark = pytest.mark.slow


def train_mlp() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_mlp", REPO / "examples" / "train_mlp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_mlp"] = module  # flax dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_seed_mlp_widened_restores_into_the_wide_model_and_trains(
    cli,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jax
    import orbax.checkpoint as ocp

    t = train_mlp()
    x, y = t.make_data()
    narrow_step = t.make_train_step(64)
    state = t.init_state(64)
    for _ in range(3):
        state, _ = narrow_step(state, x, y)
    src, dst = tmp_path / "src", tmp_path / "dst"
    mgr = ocp.CheckpointManager(str(src))
    mgr.save(3, args=ocp.args.StandardSave(state))
    mgr.wait_until_finished()
    mgr.close()

    monkeypatch.chdir(REPO)  # --target imports examples.train_mlp from the working directory
    spec = REPO / "examples" / "widen_64_to_128.yaml"
    target = "examples.train_mlp:abstract_state"
    r = cli("migrate", src, dst, "--spec", spec, "--target", target)
    assert r.code == 0, r.stderr
    assert f"matches --target {target}" in r.stdout

    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, t.init_state(128))
    restored = ocp.CheckpointManager(str(dst)).restore(3, args=ocp.args.StandardRestore(abstract))
    adam = restored["opt_state"][0]
    assert adam.mu["Dense_0"]["kernel"].shape == (16, 128)
    assert adam.nu["Dense_1"]["kernel"].shape == (128, 10)
    assert int(adam.count) == 3 and int(restored["step"]) == 3

    _, narrow_loss = narrow_step(state, x, y)
    trained, wide_loss = t.make_train_step(128)(restored, x, y)
    assert np.isfinite(float(wide_loss))
    # New units start with zero output weights: the wide model computes what the narrow one did.
    assert float(wide_loss) == pytest.approx(float(narrow_loss), rel=1e-5)
    assert int(trained["step"]) == 4

    diff = cli("diff", src, dst, "--json")
    assert diff.code == 1  # the widened leaves changed shape
    status = {leaf["name"]: leaf["status"] for leaf in diff.json()["leaves"]}
    assert sorted(n for n, s in status.items() if s == "equal") == [
        "opt_state.0.count",
        "opt_state.0.mu.Dense_1.bias",
        "opt_state.0.nu.Dense_1.bias",
        "opt_state.1",  # optax's EmptyState, an empty marker
        "params.Dense_1.bias",
        "rng",
        "step",
    ]  # bit-identical: atol = rtol = 0 by default
    assert {s for n, s in status.items() if s != "equal"} == {"shape_changed"}

    before, after = read_values(src), read_values(dst)
    unchanged = [n for n in before if "Dense_1.bias" in n or n in ("step", "rng")]
    assert len(unchanged) == 5
    for name in [*unchanged, "opt_state.0.count"]:
        assert after[name].tobytes() == before[name].tobytes(), name
    k0 = "params.Dense_0.kernel"
    assert after[k0][:, :64].tobytes() == before[k0][:, :64].tobytes()
    np.testing.assert_array_equal(np.asarray(restored["params"]["Dense_0"]["kernel"]), after[k0])


SPEC = r"""
    rules:
      - {op: rename, from: 'params\.dense\.(.*)', to: 'params.proj.\1'}
      - {op: cast, match: 'params\.proj\.kernel', dtype: bfloat16}
      - {op: drop, match: 'params\.embed'}
      - {op: add, name: params.proj.scale, shape: [32], dtype: float32, init: 'constant(1.0)'}
"""


@pytest.fixture
def migrated(cli, tmp_path: Path) -> tuple[Path, dict[str, Any]]:  # type: ignore[no-untyped-def]
    src, dst = tmp_path / "src", tmp_path / "dst"
    tree = save_sharded(src)  # mesh (8, 1): kernel P('data', None), bias P(), embed bf16
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    r = cli("migrate", src, dst, "--spec", spec, "--json")
    assert r.code == 0, r.stderr
    return dst, tree


def expected(tree: dict[str, Any]) -> dict[str, np.ndarray]:
    import ml_dtypes

    dense = tree["params"]["dense"]
    return {
        "kernel": np.asarray(dense["kernel"]).astype(ml_dtypes.bfloat16),
        "bias": np.asarray(dense["bias"]),
        "scale": np.ones(32, np.float32),
    }


def check(restored: dict[str, Any], tree: dict[str, Any]) -> None:
    assert set(restored["params"]) == {"proj"}
    want = expected(tree)
    assert want
    for name, values in want.items():
        got = np.asarray(restored["params"]["proj"][name])
        assert got.dtype == values.dtype, name
        assert got.tobytes() == values.tobytes(), name
    assert int(restored["step"]) == 42


def test_rename_cast_drop_add_restores_on_8_devices_sharded(migrated) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    dst, tree = migrated
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def sds(shape: tuple[int, ...], dtype: Any, spec: Any) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    abstract = {
        "params": {
            "proj": {
                "kernel": sds((64, 32), jax.numpy.bfloat16, P("data", "model")),
                "bias": sds((32,), np.float32, P("model")),
                "scale": sds((32,), np.float32, P("model")),
            }
        },
        "step": sds((), np.int32, P()),
    }
    mgr = ocp.CheckpointManager(str(dst), item_handlers=ocp.StandardCheckpointHandler())
    restored = mgr.restore(42, args=ocp.args.StandardRestore(abstract))
    check(restored, tree)
    kernel = restored["params"]["proj"]["kernel"]
    assert kernel.sharding.spec == P("data", "model") and len(kernel.addressable_shards) == 8

    # Without a target Orbax uses the recorded shardings: the kernel keeps its source spec.
    plain = mgr.restore(42)
    check(plain, tree)
    assert plain["params"]["proj"]["kernel"].sharding.spec == P("data", None)
    assert plain["params"]["proj"]["scale"].sharding.mesh.shape == {"data": 8, "model": 1}


def test_rename_cast_drop_add_restores_on_one_device(migrated) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import SingleDeviceSharding

    dst, tree = migrated
    one = SingleDeviceSharding(jax.devices()[0])
    abstract = {
        "params": {
            "proj": {
                "kernel": jax.ShapeDtypeStruct((64, 32), jax.numpy.bfloat16, sharding=one),
                "bias": jax.ShapeDtypeStruct((32,), np.float32, sharding=one),
                "scale": jax.ShapeDtypeStruct((32,), np.float32, sharding=one),
            }
        },
        "step": jax.ShapeDtypeStruct((), np.int32, sharding=one),
    }
    mgr = ocp.CheckpointManager(str(dst), item_handlers=ocp.StandardCheckpointHandler())
    check(mgr.restore(42, args=ocp.args.StandardRestore(abstract)), tree)
