"""Fresh checkpoints saved by the installed Orbax: ``inspect`` agrees with Orbax's own metadata.

Compares, leaf by leaf, dtype, global shape, chunk shape and sharding with what
``CheckpointManager.item_metadata`` reports, and ``--stats`` with the restored values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def _tree() -> Any:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    rs = np.random.RandomState(1)

    def put(x: np.ndarray, spec: P) -> jax.Array:
        return jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))

    return {
        "params": {
            "embed": put(rs.normal(size=(32, 8)).astype(np.float32), P("data", "model")),
            "proj": put(rs.normal(size=(8, 16)).astype(jnp.bfloat16), P(None, ("data", "model"))),
            "bias": put(np.arange(6, dtype=np.int32), P()),
        },
        "layers": [jnp.ones((3, 3)), (jnp.zeros(2, jnp.float16), jnp.asarray(7))],
        "step": 12,
        "rng": jax.random.key_data(jax.random.key(3)),
    }


def _save(root: Path, tree: Any, **handler_kw: Any) -> None:
    import orbax.checkpoint as ocp

    kw: dict[str, Any] = {}
    if handler_kw:
        kw["item_handlers"] = ocp.PyTreeCheckpointHandler(**handler_kw)
        args = ocp.args.PyTreeSave(tree)
    else:
        args = ocp.args.StandardSave(tree)
    mgr = ocp.CheckpointManager(str(root), **kw)
    mgr.save(5, args=args)
    mgr.wait_until_finished()
    mgr.close()


def _orbax_leaves(root: Path, **handler_kw: Any) -> dict[str, Any]:
    import jax
    import orbax.checkpoint as ocp

    handler = (
        ocp.PyTreeCheckpointHandler(**handler_kw) if handler_kw else ocp.StandardCheckpointHandler()
    )
    meta = ocp.CheckpointManager(str(root), item_handlers=handler).item_metadata(5)
    tree = getattr(meta, "tree", meta)
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    out = {}
    for path, leaf in flat:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        out[name] = leaf
    return out


@pytest.mark.parametrize(
    "handler_kw",
    [{}, {"use_zarr3": True}, {"use_ocdbt": False}, {"use_ocdbt": False, "use_zarr3": True}],
    ids=["standard", "zarr3", "no-ocdbt", "no-ocdbt-zarr3"],
)
def test_inspect_matches_orbax_metadata(cli, tmp_path: Path, handler_kw: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "run"
    _save(root, _tree(), **handler_kw)
    r = cli("inspect", root, "--json")
    assert r.code == 0, r.stderr
    ours = {leaf["name"]: leaf for leaf in r.json()["leaves"]}
    theirs = _orbax_leaves(root, **handler_kw)
    assert set(ours) == set(theirs)
    assert theirs
    for name, meta in theirs.items():
        leaf = ours[name]
        assert leaf["shape"] == list(meta.shape), name
        assert leaf["dtype"] == np.dtype(meta.dtype).name, name
        storage = getattr(meta, "storage", None)
        if storage is not None and storage.chunk_shape is not None:
            assert leaf["chunk_shape"] == list(storage.chunk_shape), name
        sharding = getattr(meta, "sharding", None)
        if sharding is not None and hasattr(sharding, "partition_spec"):
            spec = [list(p) if isinstance(p, tuple) else p for p in sharding.partition_spec]
            assert leaf["sharding"]["partition_spec"] == spec, name
            assert leaf["sharding"]["mesh"] == dict(
                zip(sharding.axis_names, sharding.shape, strict=True)
            ), name
    assert ours["params.proj"]["sharding"]["partition_spec"] == [None, ["data", "model"]]
    assert ours["params.embed"]["chunk_shape"] == [8, 4]


def test_stats_match_restored_values(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp

    root = tmp_path / "run"
    _save(root, _tree())
    mgr = ocp.CheckpointManager(str(root))
    meta = mgr.item_metadata(5)
    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), getattr(meta, "tree", meta)
    )
    restored = mgr.restore(5, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    doc = cli("inspect", root, "--json", "--stats").json()
    stats = {leaf["name"]: leaf["stats"] for leaf in doc["leaves"]}
    flat, _ = jax.tree_util.tree_flatten_with_path(restored)
    assert flat
    for path, value in flat:
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        ref = np.asarray(value).astype(np.float64)
        assert stats[name]["min"] == pytest.approx(ref.min()), name
        assert stats[name]["max"] == pytest.approx(ref.max()), name
        assert stats[name]["mean"] == pytest.approx(ref.mean(), rel=1e-6, abs=1e-9), name
        assert stats[name]["finite"] == ref.size, name


def test_typed_key_is_rng(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    ck = ocp.StandardCheckpointer()
    ck.save(tmp_path / "ck", {"w": jnp.ones(3), "noise": jax.random.key(0)})
    ck.wait_until_finished()
    doc = cli("inspect", tmp_path / "ck", "--json").json()
    parts = {p["part"]: p for p in doc["training_state"]["parts"]}
    assert parts["rng"]["present"] and "threefry2x32" in parts["rng"]["note"]
    assert {leaf["name"]: leaf["state_part"] for leaf in doc["leaves"]}["noise"] == "rng"


def test_nan_and_inf_counted(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp

    x = np.arange(20, dtype=np.float32)
    x[[1, 5]] = np.nan
    x[7] = np.inf
    x[8] = -np.inf
    ck = ocp.StandardCheckpointer()
    ck.save(tmp_path / "ck", {"x": x})
    ck.wait_until_finished()
    doc = cli("inspect", tmp_path / "ck", "--json", "--stats").json()
    s = doc["leaves"][0]["stats"]
    finite = x[np.isfinite(x)].astype(np.float64)
    assert (s["nan"], s["inf"], s["finite"]) == (2, 2, 16)
    assert s["mean"] == pytest.approx(finite.mean())
    human = cli("inspect", tmp_path / "ck", "--stats")
    assert "nan=2 inf=2" in human.stdout


def test_unfinished_save_is_named_as_such(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A step directory still named ``*.orbax-checkpoint-tmp*``: empty (Orbax has only made it)
    or with its item half written, ``inspect`` says what it is; fully written, it stays readable."""
    import shutil

    root = tmp_path / "run"
    _save(root, {"w": np.ones((4, 2), np.float32), "step": 5})
    whole = root / "5.orbax-checkpoint-tmp-1703334121930256"
    shutil.copytree(root / "5", whole)
    assert cli("inspect", whole).code == 0
    half = root / "6.orbax-checkpoint-tmp-1703334121930257"
    shutil.copytree(root / "5", half)
    written = sorted((half / "default").iterdir())
    assert written
    for f in written:
        if f.name != "d":
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    empty = root / "7.orbax-checkpoint-tmp"
    empty.mkdir()
    for step, path in ((6, half), (7, empty)):
        r = cli("inspect", path)
        assert r.code == 3
        lines = r.stderr.strip().splitlines()
        assert lines == [
            f"ckpt: error: {path} is an unfinished save of step {step} "
            "(wait for the save to finish, or remove it with `ckpt prune --clean-tmp`)"
        ]
        doc = cli("inspect", path, "--json").json()
        assert doc["error"]["code"] == "not-a-checkpoint"
        assert doc["error"]["message"] == f"{path} is an unfinished save of step {step}"
