"""``ckpt digest`` on real Orbax saves: a leaf's ``ld1`` digest is the same in every layout the
writers make of it (two other meshes, zarr3 and plain zarr directories and back, safetensors in
one file and in shards, imported back), equals the digest of what Orbax restores, and the
resharded step restored by Orbax resumes training for one step exactly as the original would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.digest import ld1
from tests.support.ldigest_reference import reference_digest
from tests.support.paths import FIXTURES

pytestmark = pytest.mark.slow

MESH = {"data": 4, "model": 2}
# Odd widths: a device's box of w is 3 x 17 float32 (rows of 68 bytes), of emb 8 x 3 bfloat16
# (6 bytes): box edges cut 8-byte words, so the partials' edge fragments must join.
SPECS = {"w": ("data", "model"), "b": ("model",), "emb": (None, "model")}
#: Where the 2x4 reshard puts them (``b`` is restored replicated: 34 is not a multiple of 4).
RESHARDED = {"w": ("model", "data"), "b": (), "emb": ("data", None)}


def _model() -> tuple[Any, Any, Any]:
    import jax.numpy as jnp
    import optax

    x = jnp.linspace(-1.0, 1.0, 5 * 12, dtype=jnp.float32).reshape(5, 12)

    def loss(params: Any) -> Any:
        y = x @ params["w"] + params["b"]
        return jnp.mean(y**2) + jnp.mean(params["emb"].astype(jnp.float32) ** 2)

    return loss, optax.adam(1e-2), x


def _shardings(mesh: Any, specs: dict[str, tuple[str | None, ...]]) -> dict[str, Any]:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return {k: NamedSharding(mesh, P(*spec)) for k, spec in specs.items()}


def _mesh(shape: dict[str, int]) -> Any:
    import jax
    from jax.sharding import Mesh

    devices = np.array(jax.devices()[: int(np.prod(list(shape.values())))])
    return Mesh(devices.reshape(tuple(shape.values())), tuple(shape))


def _train_state(mesh: Any, specs: dict[str, tuple[str | None, ...]] = SPECS) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(7)
    host = {
        "w": rng.standard_normal((12, 34)).astype(np.float32),
        "b": rng.standard_normal(34).astype(np.float32),
        "emb": rng.standard_normal((8, 6)).astype(jnp.bfloat16),
    }
    sh = _shardings(mesh, specs)
    params = {k: jax.device_put(v, sh[k]) for k, v in host.items()}
    loss, tx, _ = _model()
    opt_state = tx.init(params)
    grads = jax.grad(loss)(params)  # one step already taken: the moments are not zeros
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(1)}


def _step(state: dict[str, Any]) -> tuple[dict[str, Any], float]:
    import jax

    loss, tx, _ = _model()
    value, grads = jax.value_and_grad(loss)(state["params"])
    updates, opt = tx.update(grads, state["opt_state"], state["params"])
    params = jax.tree.map(lambda p, u: p + u, state["params"], updates)
    return {"params": params, "opt_state": opt, "step": state["step"] + 1}, float(value)


def _on(mesh: Any) -> Any:
    """An array's abstract value for a restore, a scalar (step, Adam's count) replicated on
    ``mesh`` like the parameters (a single-device scalar cannot join them in one update)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def abstract(x: Any) -> Any:
        sharding = NamedSharding(mesh, P()) if x.ndim == 0 else x.sharding
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return abstract


def _save(root: Path, state: dict[str, Any]) -> None:
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()


def _digests(cli: Any, path: Path) -> dict[str, str]:
    r = cli("digest", path, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    leaves = [leaf for item in doc["items"] for leaf in item["leaves"]]
    assert leaves and all(leaf["digest"] for leaf in leaves)
    return {leaf["name"]: leaf["digest"] for leaf in leaves}


def test_digests_survive_every_layout_and_match_what_orbax_restores(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp

    assert jax.device_count() == 8
    state = _train_state(_mesh(MESH))
    src = tmp_path / "src"
    _save(src, state)
    original = _digests(cli, src)
    assert {"params.w", "params.b", "params.emb", "step"} <= set(original)
    for name, x in [("params.w", state["params"]["w"]), ("params.emb", state["params"]["emb"])]:
        assert original[name] == reference_digest(np.asarray(x)), name

    rules = ["--rule", "params.w=[model, data]", "--rule", "params.emb=[data, null]"]
    z3, z2 = tmp_path / "z3", tmp_path / "z2"
    made = {
        "2x4": ["reshard", src, tmp_path / "2x4", "--mesh", "data=2,model=4", *rules],
        "8 zarr3 plain": ["reshard", src, z3, "--mesh", "data=8", "--zarr3", "--no-ocdbt"],
        "back to zarr2 ocdbt": ["reshard", z3, z2, "--mesh", "data=1", "--zarr2", "--ocdbt"],
        "safetensors": ["export", src, tmp_path / "st1"],
        "safetensors shards": ["export", src, tmp_path / "stn", "--max-shard-size", "600B"],
    }
    for what, args in made.items():
        r = cli(*args)
        assert r.code == 0, (what, r.stderr)
    assert len(list((tmp_path / "stn").glob("*.safetensors"))) > 1
    r = cli("import", tmp_path / "stn", tmp_path / "imported", "--step", "1")
    assert r.code == 0, r.stderr
    copies = {
        "2x4": tmp_path / "2x4",
        "8 zarr3 plain": tmp_path / "z3",
        "back to zarr2 ocdbt": tmp_path / "z2",
        "safetensors": tmp_path / "st1",
        "safetensors shards": tmp_path / "stn",
        "imported": tmp_path / "imported",
    }
    for what, path in copies.items():
        got = _digests(cli, path)
        assert got, what
        common = set(got) & set(original)
        assert common >= {"params.w", "params.b", "params.emb"}, (what, sorted(got))
        assert {n: got[n] for n in common} == {n: original[n] for n in common}, what

    # What Orbax restores from the resharded copy has the same digests, and resumes training.
    mesh = _mesh({"data": 2, "model": 4})
    abstract = jax.tree.map(_on(mesh), _train_state(mesh, RESHARDED))
    with ocp.CheckpointManager(str(tmp_path / "2x4")) as mgr:
        restored = mgr.restore(1, args=ocp.args.StandardRestore(abstract))
    for k in SPECS:
        assert ld1.digest_array(np.asarray(restored["params"][k])) == original[f"params.{k}"]
    after, loss = _step(restored)
    expected_state, expected_loss = _step(state)
    assert int(after["step"]) == int(state["step"]) + 1 == 2
    assert np.isfinite(loss) and loss == pytest.approx(expected_loss, rel=1e-6)
    for k in SPECS:
        np.testing.assert_allclose(
            np.asarray(after["params"][k], np.float32),
            np.asarray(expected_state["params"][k], np.float32),
            rtol=1e-6,
        )


#: Every Orbax fixture Orbax restores in place (msgpack_legacy is Flax's, not Orbax's;
#: unmerged_ocdbt is compared with the checkpoint it was derived from, below).
ORBAX_FIXTURES = ["seed_mlp", "sharded_4x2", "bf16", "no_ocdbt", "no_ocdbt_zarr3", "v1_zarr3"]
ORBAX_FIXTURES += ["composite_best", "multiprocess", "prefixed", "single_checkpointer"]
ORBAX_FIXTURES += ["strings", "with_tmp"]


@pytest.mark.parametrize("fixture", ORBAX_FIXTURES)
def test_fixture_digests_are_the_reference_digests_of_orbaxs_values(fixture: str, cli) -> None:  # type: ignore[no-untyped-def]
    from tests.support.orbax_truth import restore_leaves

    r = cli("digest", FIXTURES / fixture, "--json")
    assert r.code == 0, r.stderr
    # JSON items (metrics) hold no arrays for Orbax's PyTree restore; their digests are of text.
    items = [i for i in r.json()["items"] if any(x["dtype"] != "json" for x in i["leaves"])]
    assert items
    for item in items:
        truth = restore_leaves(Path(item["path"]))
        arrays = [leaf for leaf in item["leaves"] if leaf["name"] in truth]
        assert arrays, item["item"]
        for leaf in arrays:
            assert leaf["digest"] == reference_digest(np.asarray(truth[leaf["name"]])), leaf["name"]


def test_unmerged_ocdbt_digests_are_those_of_the_checkpoint_it_was_derived_from(cli) -> None:  # type: ignore[no-untyped-def]
    """Orbax cannot restore ``unmerged_ocdbt`` in place (per-process databases never merged):
    its values are ``multiprocess``'s (tests/support/orbax_truth.py), so are its digests."""
    from tests.support.orbax_truth import DERIVED_FROM

    def digests(fixture: str) -> dict[str, str]:
        r = cli("digest", FIXTURES / fixture, "--json")
        assert r.code == 0, r.stderr
        return {x["name"]: x["digest"] for i in r.json()["items"] for x in i["leaves"]}

    unmerged = digests("unmerged_ocdbt")
    assert unmerged and all(unmerged.values())
    assert unmerged == digests(DERIVED_FROM["unmerged_ocdbt"])
